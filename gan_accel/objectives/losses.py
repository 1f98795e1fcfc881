"""Adversarial objectives as pure functions of discriminator logits.

Each takes raw logits (``sigmoid`` + ``BCELoss`` is unstable under autocast) and returns a mean over the
batch, so k micro-batches average to the k-times larger batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import ConfigError

Tensor = torch.Tensor


@dataclass(frozen=True)
class GANLoss:
    """A discriminator objective and the matching generator objective, both to be minimised.

    ``d_loss(real_logits, fake_logits)`` and ``g_loss(fake_logits)`` return scalar tensors; a
    ``relativistic`` loss's G also reads D's (detached) logits on the real batch:
    ``g_loss(fake_logits, real_logits)``. Pass your own instance as
    ``TrainConfig(loss=GANLoss("mine", d_fn, g_fn))``.
    """

    name: str
    d_loss: Callable[[Tensor, Tensor], Tensor]
    g_loss: Callable[..., Tensor]
    relativistic: bool = False


def nonsaturating_d(real: Tensor, fake: Tensor) -> Tensor:
    """-log D(x) - log(1 - D(G(z))), written with softplus on logits."""
    return F.softplus(-real).mean() + F.softplus(fake).mean()


def nonsaturating_g(fake: Tensor) -> Tensor:
    """-log D(G(z)) (Goodfellow et al.'s non-saturating generator loss)."""
    return F.softplus(-fake).mean()


def hinge_d(real: Tensor, fake: Tensor) -> Tensor:
    """max(0, 1 - D(x)) + max(0, 1 + D(G(z)))."""
    return F.relu(1.0 - real).mean() + F.relu(1.0 + fake).mean()


def wasserstein_d(real: Tensor, fake: Tensor) -> Tensor:
    """Critic loss D(G(z)) - D(x); pair it with a Lipschitz constraint of your choice."""
    return fake.mean() - real.mean()


def negated_fake_g(fake: Tensor) -> Tensor:
    """-D(G(z)), the generator loss of both the hinge and the Wasserstein GAN."""
    return -fake.mean()


def least_squares_d(real: Tensor, fake: Tensor) -> Tensor:
    """LSGAN: 1/2 (D(x) - 1)^2 + 1/2 D(G(z))^2."""
    return 0.5 * (real - 1.0).pow(2).mean() + 0.5 * fake.pow(2).mean()


def least_squares_g(fake: Tensor) -> Tensor:
    """LSGAN generator: 1/2 (D(G(z)) - 1)^2."""
    return 0.5 * (fake - 1.0).pow(2).mean()


def rpgan_d(real: Tensor, fake: Tensor) -> Tensor:
    """Relativistic pairing (RpGAN; Jolicoeur-Martineau 2019, R3GAN): softplus(-(D(x_i) - D(G(z_i)))),
    averaged over the pairs (sample i of the real batch with sample i of the fake one)."""
    return F.softplus(fake - real).mean()


def rpgan_g(fake: Tensor, real: Tensor) -> Tensor:
    """RpGAN's generator: softplus(-(D(G(z_i)) - D(x_i))), D's loss with the roles swapped."""
    return rpgan_d(fake, real)


LOSSES: dict[str, GANLoss] = {
    loss.name: loss
    for loss in (
        GANLoss("nonsaturating", nonsaturating_d, nonsaturating_g),
        GANLoss("hinge", hinge_d, negated_fake_g),
        GANLoss("wasserstein", wasserstein_d, negated_fake_g),
        GANLoss("least_squares", least_squares_d, least_squares_g),
        GANLoss("rpgan", rpgan_d, rpgan_g, relativistic=True),
    )
}


def get_loss(loss: str | GANLoss) -> GANLoss:
    """Resolve a loss name (see ``LOSSES``) or pass a :class:`GANLoss` through."""
    if isinstance(loss, GANLoss):
        return loss
    try:
        return LOSSES[loss]
    except KeyError:
        raise ConfigError(f"unknown loss {loss!r}: choose one of {', '.join(sorted(LOSSES))}, or pass a GANLoss") from None
