"""Phase losses built from a :class:`~gan_accel.objectives.losses.GANLoss`.

A *phase loss* is a function of the step's context (see :class:`~gan_accel.engine.context.StepContext`)
returning a scalar: the mean over the micro-batch, so that k micro-batches average to the loss of
one k-times larger batch. ``ctx.fake`` is already detached in a phase that does not train G, so the
discriminator's loss never reaches the generator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from .losses import GANLoss

if TYPE_CHECKING:  # the engine depends on objectives, never the other way round
    from ..engine.context import StepContext

PhaseLoss = Callable[["StepContext"], Tensor]


def discriminator_loss(loss: GANLoss, class_weight: float = 0.0) -> PhaseLoss:
    """D's adversarial loss on real images and G's (detached) images; logs the mean logits.

    ``class_weight > 0`` (a conditional run) adds ``class_weight`` times the cross-entropy of D's
    class logits (see :meth:`StepContext.class_logits`) on the *real* images and their labels, as
    an auxiliary classifier (AC-GAN, Odena et al. 2017, trained on real data only): D learns what
    each class looks like, and G's class loss (see :func:`generator_loss`) pulls its samples there.
    """

    def adversarial_d(ctx: "StepContext") -> Tensor:
        if class_weight:
            real_classes = ctx.class_logits(ctx.real, ctx.real_labels)
            real_logits = _column(real_classes, ctx.real_labels)
            fake_logits = _column(ctx.class_logits(ctx.fake, ctx.fake_labels), ctx.fake_labels)
        else:
            real_logits = ctx.discriminate(ctx.real, ctx.real_labels)
            fake_logits = ctx.discriminate(ctx.fake, ctx.fake_labels)
        ctx.observe_real(real_logits)  # an adaptive augmentation's statistic
        ctx.log("D(x)", real_logits.mean())
        ctx.log("D(G(z))", fake_logits.mean())
        total = loss.d_loss(real_logits, fake_logits)
        if class_weight:
            class_loss = F.cross_entropy(real_classes.float(), ctx.real_labels)
            ctx.log("class_loss/real", class_loss.detach())
            total = total + class_weight * class_loss
        return total

    adversarial_d.__qualname__ = f"discriminator_loss({loss.name}" + (f", class {class_weight})" if class_weight else ")")
    return adversarial_d


def generator_loss(loss: GANLoss, class_weight: float = 0.0) -> PhaseLoss:
    """G's adversarial loss through the (frozen) discriminator; ``class_weight > 0`` adds that times
    the cross-entropy of D's class logits on G's samples against the labels G was given."""

    def adversarial_g(ctx: "StepContext") -> Tensor:
        if not class_weight:
            return loss.g_loss(ctx.discriminate(ctx.fake, ctx.fake_labels))
        classes = ctx.class_logits(ctx.fake, ctx.fake_labels)
        class_loss = F.cross_entropy(classes.float(), ctx.fake_labels)
        ctx.log("class_loss/fake", class_loss.detach())
        return loss.g_loss(_column(classes, ctx.fake_labels)) + class_weight * class_loss

    adversarial_g.__qualname__ = f"generator_loss({loss.name}" + (f", class {class_weight})" if class_weight else ")")
    return adversarial_g


def _column(logits: Tensor, labels: Tensor) -> Tensor:
    """Row i's entry at column labels[i]: each sample's logit for its own label, shape (N,)."""
    return torch.gather(logits, 1, labels.reshape(-1, 1)).reshape(-1)


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
