"""What every augmentation for D shares: the interface, the no-op, per-sample coin flips.

An augmentation is a differentiable ``augment(x) -> x'`` on (N, C, H, W) with a probability ``p`` per
transform and sample (``p = 0`` returns ``x`` itself); its draws come from torch's global generator on
``x``'s device, so a checkpoint with each process's RNG state resumes it exactly.
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
    """(N,) bools, each true with probability ``p``; None when ``p >= 1`` (no draw, no select). One draw per
    sample whatever its outcome, so the RNG stream does not depend on the data."""
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
