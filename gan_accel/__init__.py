"""gan_accel: train GANs with custom loops on Hugging Face Accelerate."""

from .config import ConfigError, TrainConfig
from .engine import GANTrainer, extract_images
from .launch import LaunchError, build_accelerator
from .losses import LOSSES, GANLoss, get_loss
from .schedules import lambda_scheduler, warmup_then_decay

__all__ = [
    "GANTrainer",
    "TrainConfig",
    "ConfigError",
    "LaunchError",
    "GANLoss",
    "LOSSES",
    "get_loss",
    "build_accelerator",
    "extract_images",
    "lambda_scheduler",
    "warmup_then_decay",
]
__version__ = "0.1.0"
