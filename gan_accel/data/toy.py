"""Toy 2-D data: Gaussian modes on a ring (the classic mode-collapse benchmark of GAN papers)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def ring_centres(modes: int = 8, radius: float = 2.0) -> Tensor:
    """The ``modes`` centres, evenly spaced on a circle of ``radius``, as (modes, 2) float32."""
    angles = torch.arange(modes, dtype=torch.float64) * (2 * math.pi / modes)
    return (torch.stack([angles.cos(), angles.sin()], 1) * radius).float()


def ring_of_gaussians(n: int, modes: int = 8, radius: float = 2.0, std: float = 0.02,
                      seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n`` points (n, 2) float32 drawn evenly from isotropic Gaussians at :func:`ring_centres`, and
    each point's mode index (n,) int64. Deterministic for a seed."""
    generator = torch.Generator().manual_seed(seed)
    mode = torch.randint(0, modes, (n,), generator=generator)
    points = ring_centres(modes, radius)[mode] + std * torch.randn(n, 2, generator=generator)
    return points, mode
