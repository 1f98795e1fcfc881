"""Mode coverage of 2-D samples against known mode centres, under PacGAN's protocol (the ring and grid benchmarks)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def mode_coverage(samples: Tensor, centres: Tensor, std: float) -> dict[str, Any]:
    """How many modes a generator captures, how many of its samples are good, and how evenly it spreads them.

    PacGAN's protocol (after VEEGAN): a sample is *high quality* when it lies within 3 ``std`` of its nearest
    centre; a mode is *captured* when at least one high-quality sample is nearest to it; ``reverse_kl`` is
    KL(the high-quality samples' distribution over modes || uniform), 0 when spread evenly, log(modes) when
    all on one (infinite when there is no high-quality sample).

    Returns ``modes``, ``num_modes``, ``high_quality`` (share of all samples), ``reverse_kl``,
    ``mode_shares`` (share of all samples that are high quality at each mode) and ``num_samples``.
    """
    if samples.dim() != 2 or samples.shape[1] != centres.shape[1]:
        raise ValueError(f"samples must be (N, {centres.shape[1]}), got {tuple(samples.shape)}")
    samples = samples.detach().double().cpu()
    nearest_distance, nearest = torch.cdist(samples, centres.double().cpu()).min(dim=1)
    good = nearest_distance <= 3 * std
    counts = torch.bincount(nearest[good], minlength=centres.shape[0]).double()
    p = counts[counts > 0] / counts.sum()
    return {
        "modes": int((counts > 0).sum()),
        "num_modes": int(centres.shape[0]),
        "high_quality": float(good.double().mean()),
        "reverse_kl": float((p * (p * len(centres)).log()).sum()) if good.any() else math.inf,
        "mode_shares": [round(float(c) / len(samples), 4) for c in counts],
        "num_samples": int(len(samples)),
    }
