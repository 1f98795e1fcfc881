"""Mode coverage of 2-D samples against known mode centres (the ring-of-Gaussians benchmark)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def mode_coverage(samples: Tensor, centres: Tensor, threshold: float = 0.12, min_share: float = 0.01) -> dict[str, Any]:
    """How many modes a generator covers, and how many of its samples are good.

    A sample is *high quality* when it lies within ``threshold`` of some centre; a mode is *covered*
    when at least ``min_share`` of all samples are high-quality samples nearest to it.

    Returns ``modes`` (covered modes), ``num_modes``, ``high_quality`` (share of high-quality samples),
    ``mode_shares`` (share of all samples that are high quality at each mode) and ``num_samples``.
    """
    if samples.dim() != 2 or samples.shape[1] != centres.shape[1]:
        raise ValueError(f"samples must be (N, {centres.shape[1]}), got {tuple(samples.shape)}")
    samples = samples.detach().double().cpu()
    distances = torch.cdist(samples, centres.double().cpu())
    nearest_distance, nearest = distances.min(dim=1)
    good = nearest_distance <= threshold
    counts = torch.bincount(nearest[good], minlength=centres.shape[0]).double()
    shares = counts / len(samples)
    return {
        "modes": int((shares >= min_share).sum()),
        "num_modes": int(centres.shape[0]),
        "high_quality": float(good.double().mean()),
        "mode_shares": [round(float(s), 4) for s in shares],
        "num_samples": int(len(samples)),
    }
