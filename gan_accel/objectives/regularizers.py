"""Gradient penalties on D's input: R1 and R2 (Mescheder et al. 2018) and WGAN-GP (Gulrajani et al. 2017).

* **Accumulation**: a mean of per-sample terms, so k micro-batches of b give the penalty of one batch of k*b.
* **fp16**: the input gradient is taken of the *scaled* output, then unscaled (:func:`scaled_input_gradients`):
  no underflow, and an overflow is a non-finite penalty the GradScaler skips.
* **DDP**: ``torch.autograd.grad`` bypasses DDP's reducer and leaves some parameters without a gradient,
  which DDP would wait for: each penalty ends in ``+ 0 * logits.sum()`` of the same forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Union

import torch
from torch import Tensor

if TYPE_CHECKING:
    from ..engine.context import StepContext

PhaseLoss = Callable[["StepContext"], Tensor]
EpsilonSampler = Callable[[int, Tensor], Tensor]
Gamma = Union[float, Callable[[int], float]]  # a number, or a function of the training images seen (a Ramp)


# The largest scale a penalty's own gradient uses. The gradient of a scaled sum of fp16 logits reaches each
# logit as the scale itself, and the GradScaler's default 2**16 is above fp16's largest finite value (65504):
# every penalty at that scale came out inf and its update was skipped. 2**15 still lifts small gradients
# out of fp16's underflow range, which is what the scaling is for.
PENALTY_MAX_SCALE = 2.0 ** 15


def scaled_input_gradients(output: Tensor, inputs: Tensor, scaler: Any | None = None) -> Tensor:
    """``d output / d inputs`` with a graph; with a GradScaler, taken of the scaled output (scale capped at
    :data:`PENALTY_MAX_SCALE`, read on the device) and unscaled, as PyTorch's AMP recipe does."""
    if scaler is None or not getattr(scaler, "is_enabled", lambda: True)():
        (grad,) = torch.autograd.grad(output, inputs, create_graph=True)
        return grad
    # the scaler's scale as a device tensor (scale() of a one: public, no host sync, initialised on first use)
    scale = scaler.scale(torch.ones((), device=output.device)).float().clamp(max=PENALTY_MAX_SCALE).reshape(())
    (grad,) = torch.autograd.grad(output.float() * scale, inputs, create_graph=True)
    return grad * scale.double().reciprocal().to(grad.dtype)


def zero_centred(ctx: "StepContext", logits: Tensor, x: Tensor, gamma: Gamma) -> Tensor:
    """``gamma / 2 * E_i |grad_x D(x_i)|^2`` from D's ``logits`` on ``x`` (a leaf with ``requires_grad``); a
    ``gamma`` that is a function (a :class:`~gan_accel.config.Ramp`) is read at ``ctx.images``."""
    if callable(gamma):
        gamma = gamma(ctx.images)
    return ctx.input_gradients(logits.sum(), x).square().flatten(1).sum(1).mean() * (gamma / 2)


def r1_penalty(gamma: Gamma) -> PhaseLoss:
    """R1: ``gamma / 2 * E_x |grad_x D(x)|^2`` on real data (conditioned on the real labels, if any)."""
    return _penalty(gamma, on_fakes=False)


def r2_penalty(gamma: Gamma) -> PhaseLoss:
    """R2: ``gamma / 2 * E_z |grad D(G(z))|^2`` at G's (detached) samples, judged with G's labels."""
    return _penalty(gamma, on_fakes=True)


def _penalty(gamma: Gamma, on_fakes: bool) -> PhaseLoss:
    def penalty(ctx: "StepContext") -> Tensor:
        x = (ctx.fake.to(ctx.real.dtype) if on_fakes else ctx.real).detach().requires_grad_(True)
        logits = ctx.discriminate(x, ctx.fake_labels if on_fakes else ctx.real_labels)
        return zero_centred(ctx, logits, x, gamma) + logits.sum() * 0.0  # every D parameter gets a gradient

    penalty.__qualname__ = f"{'r2' if on_fakes else 'r1'}_penalty(gamma={gamma:g})"
    return penalty


def uniform_epsilon(batch_size: int, like: Tensor) -> Tensor:
    """One mixing weight per sample, uniform in [0, 1), shaped to broadcast over ``like``'s sample dims."""
    return torch.rand(batch_size, *([1] * (like.dim() - 1)), device=like.device, dtype=like.dtype)


def gradient_penalty(weight: float = 10.0, epsilon: EpsilonSampler | None = None) -> PhaseLoss:
    """WGAN-GP: ``weight * E (|grad D(x_hat)| - 1)^2`` with ``x_hat`` between a real and a fake sample.

    ``epsilon(batch_size, real)`` draws the mixing weights (uniform by default). In a conditional run
    the interpolates are judged with the real labels.
    """
    draw = epsilon or uniform_epsilon

    def gp(ctx: "StepContext") -> Tensor:
        real, fake = ctx.real.detach(), ctx.fake.detach().to(ctx.real.dtype)
        eps = draw(real.shape[0], real)
        x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
        logits = ctx.discriminate(x_hat, ctx.real_labels)
        grad = ctx.input_gradients(logits.sum(), x_hat)
        # sqrt(sum + tiny): the plain norm's gradient is undefined at exactly zero.
        norm = (grad.flatten(1).square().sum(1) + 1e-12).sqrt()
        return weight * (norm - 1).square().mean() + logits.sum() * 0.0

    gp.__qualname__ = f"gradient_penalty(weight={weight:g})"
    return gp
