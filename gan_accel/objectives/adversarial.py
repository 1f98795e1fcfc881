"""Phase losses built from a :class:`~gan_accel.objectives.losses.GANLoss`.

A *phase loss* is a function of the step's context (see :class:`~gan_accel.engine.context.StepContext`)
returning a scalar: the mean over the micro-batch, so that k micro-batches average to the loss of
one k-times larger batch. ``ctx.fake`` is already detached in a phase that does not train G, so the
discriminator's loss never reaches the generator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from torch import Tensor

from .losses import GANLoss

if TYPE_CHECKING:  # the engine depends on objectives, never the other way round
    from ..engine.context import StepContext

PhaseLoss = Callable[["StepContext"], Tensor]


def discriminator_loss(loss: GANLoss) -> PhaseLoss:
    """D's adversarial loss on real images and G's (detached) images; logs the mean logits."""

    def adversarial_d(ctx: "StepContext") -> Tensor:
        real_logits = ctx.discriminate(ctx.real, ctx.real_labels)
        fake_logits = ctx.discriminate(ctx.fake, ctx.fake_labels)
        ctx.log("D(x)", real_logits.mean())
        ctx.log("D(G(z))", fake_logits.mean())
        return loss.d_loss(real_logits, fake_logits)

    adversarial_d.__qualname__ = f"discriminator_loss({loss.name})"
    return adversarial_d


def generator_loss(loss: GANLoss) -> PhaseLoss:
    """G's adversarial loss through the (frozen) discriminator."""

    def adversarial_g(ctx: "StepContext") -> Tensor:
        return loss.g_loss(ctx.discriminate(ctx.fake, ctx.fake_labels))

    adversarial_g.__qualname__ = f"generator_loss({loss.name})"
    return adversarial_g


def sum_losses(*losses: PhaseLoss) -> PhaseLoss:
    """One phase loss that is the sum of several (e.g. D's adversarial loss plus a gradient penalty)."""
    if not losses:
        raise ValueError("sum_losses needs at least one loss")

    def summed(ctx: "StepContext") -> Tensor:
        total = losses[0](ctx)
        for term in losses[1:]:
            total = total + term(ctx)
        return total

    summed.__qualname__ = " + ".join(getattr(f, "__qualname__", "loss") for f in losses)
    return summed
