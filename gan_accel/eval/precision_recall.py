"""Improved precision and recall (Kynkaanniemi et al., 2019): each set's manifold is the union of balls reaching
each point's k-th nearest neighbour; precision is the share of generated samples inside the real manifold
(realism), recall the share of real samples inside the generated one (coverage)."""

from __future__ import annotations

import torch
from torch import Tensor

from .kid import _check_pair


def _distances(a: Tensor, b: Tensor) -> Tensor:
    """Euclidean distances (N, M) in float64, clamped at 0 against round-off."""
    squared = (a * a).sum(1, keepdim=True) - 2 * a @ b.T + (b * b).sum(1)[None, :]
    return squared.clamp_min(0).sqrt()


def knn_radii(points: Tensor, k: int, batch_size: int = 1000) -> Tensor:
    """Distance of each point to its k-th nearest other point of the same set, computed in row blocks."""
    # the point itself is at distance 0 and comes first: the k-th neighbour is at index k
    return torch.cat([_distances(points[start:start + batch_size], points).kthvalue(k + 1, dim=1).values
                      for start in range(0, len(points), batch_size)])


def coverage_share(queries: Tensor, points: Tensor, radii: Tensor, batch_size: int = 1000) -> float:
    """Share of ``queries`` within ``radii[j]`` of some ``points[j]``."""
    inside = [(_distances(queries[start:start + batch_size], points) <= radii[None, :]).any(dim=1)
              for start in range(0, len(queries), batch_size)]
    return float(torch.cat(inside).double().mean())


def precision_recall(fake: Tensor, real: Tensor, k: int = 3, batch_size: int = 1000) -> tuple[float, float]:
    """(precision, recall) of generated features against real ones (both (N, F)), in float64."""
    _check_pair(fake, real)
    if k < 1 or k >= min(len(fake), len(real)):
        raise ValueError(f"k={k} needs more samples: each set must have more than k points "
                         f"(got {len(fake)} fake, {len(real)} real)")
    fake, real = fake.detach().to(torch.float64).cpu(), real.detach().to(torch.float64).cpu()
    precision = coverage_share(fake, real, knn_radii(real, k, batch_size), batch_size)
    recall = coverage_share(real, fake, knn_radii(fake, k, batch_size), batch_size)
    return precision, recall
