"""What every augmentation for D shares: the interface, the no-op, per-sample coin flips.

An augmentation is a callable ``augment(x) -> x'`` on a batch (N, C, H, W), differentiable w.r.t.
``x``, with an attribute ``p``: the probability with which each of its transforms is applied to each
sample. ``p = 0`` returns ``x`` itself. Its random draws come from torch's global generator on
``x``'s device, so a checkpoint that saves each process's RNG state resumes it exactly.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn


@runtime_checkable
class Augment(Protocol):
    """``augment(x) -> x'`` with a per-transform, per-sample probability ``p``."""

    p: float

    def __call__(self, x: Tensor) -> Tensor: ...


class NoAugment(nn.Module):
    """The identity (``--augment none``): ``p`` is 0 and stays 0."""

    p: float = 0.0

    def forward(self, x: Tensor) -> Tensor:
        return x


def coin_flips(n: int, p: float, device: torch.device) -> Tensor | None:
    """(N,) bools, each true with probability ``p``; None when ``p >= 1`` (every sample: no draw, no select).

    With ``p < 1`` one uniform number per sample is drawn, whatever its outcome, so the number of draws
    (and the RNG stream after them) does not depend on the data.
    """
    if p >= 1:
        return None
    return torch.rand(n, device=device) < p


def keep_unselected(selected: Tensor | None, new: Tensor, old: Tensor) -> Tensor:
    """``new`` for the selected samples, ``old`` (its exact bytes) for the others; ``new`` if ``selected`` is None."""
    if selected is None:
        return new
    return torch.where(selected.view(-1, *([1] * (new.dim() - 1))), new, old)


def check_probability(p: float, name: str = "p") -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{name}={p!r} must be a probability in [0, 1]")
    return float(p)
