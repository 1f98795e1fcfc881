"""Phase losses built from a :class:`~gan_accel.objectives.losses.GANLoss`: functions of the step's context
returning the mean over the micro-batch (``ctx.fake`` is detached where G is not trained)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.nn import functional as F

from .losses import GANLoss
from .regularizers import Gamma, PhaseLoss, zero_centred

if TYPE_CHECKING:  # the engine depends on objectives, never the other way round
    from ..engine.context import StepContext


def discriminator_loss(loss: GANLoss, class_weight: float = 0.0, r1_gamma: Gamma = 0.0,
                       r2_gamma: Gamma = 0.0) -> PhaseLoss:
    """D's adversarial loss on real images and G's (detached) images; logs the mean logits.

    ``class_weight > 0`` adds the cross-entropy of D's class logits on the *real* images (AC-GAN, trained on
    real data only). ``r1_gamma`` / ``r2_gamma`` (numbers or Ramps) add the zero-centred penalties on the real /
    fake images, from the same two forwards of D (R3GAN's D step), so every parameter of D gets its gradient (as
    DDP needs).
    """

    def adversarial_d(ctx: "StepContext") -> Tensor:
        real = ctx.real.detach().requires_grad_(True) if r1_gamma else ctx.real
        fake = ctx.fake.detach().to(ctx.real.dtype).requires_grad_(True) if r2_gamma else ctx.fake
        real_logits, real_classes = _judge(ctx, real, ctx.real_labels, class_weight)
        fake_logits, _ = _judge(ctx, fake, ctx.fake_labels, class_weight)
        # An adaptive augmentation's statistic: ADA's sign of D(x), or for a relativistic loss, whose logits
        # have no fixed zero, the sign of D(x_i) - D(G(z_i)) over the pairs it compares (1: D separates all).
        ctx.observe_real((real_logits - fake_logits).detach() if loss.relativistic else real_logits.detach())
        ctx.log("D(x)", real_logits.mean())
        ctx.log("D(G(z))", fake_logits.mean())
        total = loss.d_loss(real_logits, fake_logits)
        if class_weight:
            class_loss = F.cross_entropy(real_classes.float(), ctx.real_labels)
            ctx.log("class_loss/real", class_loss.detach())
            total = total + class_weight * class_loss
        for gamma, logits, x, key in ((r1_gamma, real_logits, real, "R1"), (r2_gamma, fake_logits, fake, "R2")):
            if gamma:
                penalty = zero_centred(ctx, logits, x, gamma)
                ctx.log(f"penalty/{key}", penalty.detach())
                total = total + penalty
        return total

    terms = [f"class {class_weight}" * bool(class_weight), f"R1 {r1_gamma:g}" * bool(r1_gamma),
             f"R2 {r2_gamma:g}" * bool(r2_gamma)]
    adversarial_d.__qualname__ = f"discriminator_loss({', '.join([loss.name] + [t for t in terms if t])})"
    return adversarial_d


def generator_loss(loss: GANLoss, class_weight: float = 0.0) -> PhaseLoss:
    """G's adversarial loss through the (frozen) discriminator; ``class_weight > 0`` adds that times
    the cross-entropy of D's class logits on G's samples against the labels G was given. A
    relativistic loss (RpGAN) also judges the real images D just saw, detached: G's loss reads them."""

    def adversarial_g(ctx: "StepContext") -> Tensor:
        logits, classes = _judge(ctx, ctx.fake, ctx.fake_labels, class_weight)
        if loss.relativistic:
            total = loss.g_loss(logits, _judge(ctx, ctx.real, ctx.real_labels, class_weight)[0].detach())
        else:
            total = loss.g_loss(logits)
        if not class_weight:
            return total
        class_loss = F.cross_entropy(classes.float(), ctx.fake_labels)
        ctx.log("class_loss/fake", class_loss.detach())
        return total + class_weight * class_loss

    adversarial_g.__qualname__ = f"generator_loss({loss.name}" + (f", class {class_weight})" if class_weight else ")")
    return adversarial_g


def _judge(ctx: "StepContext", x: Tensor, labels: Tensor | None, class_weight: float) -> tuple[Tensor, Tensor | None]:
    """D's logit per sample and, with a class loss, its (N, K) class logits: one forward for both."""
    if not class_weight:
        return ctx.discriminate(x, labels), None
    classes = ctx.class_logits(x, labels)
    return torch.gather(classes, 1, labels.reshape(-1, 1)).reshape(-1), classes  # each sample's own label's logit


def sum_losses(*losses: PhaseLoss) -> PhaseLoss:
    """One phase loss that is the sum of several (e.g. D's adversarial loss plus a gradient penalty)."""
    if not losses:
        raise ValueError("sum_losses needs at least one loss")

    def summed(ctx: "StepContext") -> Tensor:
        return sum((term(ctx) for term in losses[1:]), losses[0](ctx))

    summed.__qualname__ = " + ".join(getattr(f, "__qualname__", "loss") for f in losses)
    return summed
