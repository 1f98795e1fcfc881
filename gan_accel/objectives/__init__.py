"""What the networks minimise: adversarial losses (pure functions of logits), the phase losses built from
them, and the gradient penalties (R1, R2, WGAN-GP); nothing here knows about Accelerate or the models."""

from .adversarial import discriminator_loss, generator_loss, sum_losses
from .losses import LOSSES, GANLoss, get_loss
from .regularizers import gradient_penalty, r1_penalty, r2_penalty, scaled_input_gradients

__all__ = [
    "GANLoss",
    "LOSSES",
    "get_loss",
    "discriminator_loss",
    "generator_loss",
    "sum_losses",
    "r1_penalty",
    "r2_penalty",
    "gradient_penalty",
    "scaled_input_gradients",
]
