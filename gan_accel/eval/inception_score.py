"""Inception score (Salimans et al., 2016) from an extractor's class logits:
``exp(E_x KL(p(y|x) || p(y)))`` per split of the samples, mean and std over the splits."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def inception_score(logits: Tensor, splits: int = 10) -> tuple[float, float]:
    """(mean, population std) over ``splits`` contiguous parts of logits (N, K), computed in float64."""
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"logits must be (N, K) with K >= 2 classes, got shape {tuple(logits.shape)}")
    if splits < 1 or splits > len(logits):
        raise ValueError(f"splits={splits} must be between 1 and the number of samples ({len(logits)})")
    log_p = torch.log_softmax(logits.detach().to(torch.float64).cpu(), dim=1)
    scores = []
    for part in log_p.tensor_split(splits):
        log_marginal = torch.logsumexp(part, dim=0) - math.log(len(part))
        prob = part.exp()
        # 0 * log 0 = 0: a class with probability 0 (a -inf logit) must add nothing, not NaN.
        terms = torch.where(prob > 0, prob * (part - log_marginal), torch.zeros_like(prob))
        kl = terms.sum(dim=1).mean()
        scores.append(float(kl.exp()))
    values = torch.tensor(scores, dtype=torch.float64)
    return float(values.mean()), float(values.std(unbiased=False))
