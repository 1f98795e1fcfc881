"""The Fréchet distance between Gaussians fitted to two feature sets.

    |mu1 - mu2|^2 + tr(sigma1) + tr(sigma2) - 2 tr((sigma1 sigma2)^(1/2)).

It is computed here in float64 with torch alone (no scipy): ``sigma1 sigma2`` is similar to the
symmetric PSD matrix ``s sigma2 s`` with ``s = sigma1^(1/2)``, so the trace of its square root is the
sum of the square roots of that matrix's eigenvalues, which a symmetric eigensolver gives stably.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _sym_sqrt(matrix: Tensor) -> Tensor:
    """Square root of a symmetric PSD matrix via eigendecomposition (tiny negative eigenvalues -> 0)."""
    eigvals, eigvecs = torch.linalg.eigh(matrix)
    # Round-off makes near-zero eigenvalues of a PSD matrix slightly negative; sqrt would give NaN.
    return (eigvecs * eigvals.clamp_min(0).sqrt()) @ eigvecs.T


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2) (means (F,), symmetric PSD covariances
    (F, F)), computed in float64."""
    mu1, mu2, sigma1, sigma2 = (t.detach().to(torch.float64).cpu() for t in (mu1, mu2, sigma1, sigma2))
    if mu1.shape != mu2.shape or mu1.ndim != 1:
        raise ValueError(f"means must be 1-D with equal shapes, got {tuple(mu1.shape)} and {tuple(mu2.shape)}")
    dim = mu1.shape[0]
    if sigma1.shape != (dim, dim) or sigma2.shape != (dim, dim):
        raise ValueError(
            f"covariances must have shape ({dim}, {dim}), got {tuple(sigma1.shape)} and {tuple(sigma2.shape)}"
        )
    # Symmetrize first: eigh reads only one triangle, so an asymmetric input would be silently misread.
    sigma1 = (sigma1 + sigma1.T) / 2
    sigma2 = (sigma2 + sigma2.T) / 2
    root1 = _sym_sqrt(sigma1)
    middle = root1 @ sigma2 @ root1
    trace_sqrt = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp_min(0).sqrt().sum()
    diff = mu1 - mu2
    value = diff @ diff + torch.trace(sigma1) + torch.trace(sigma2) - 2 * trace_sqrt
    # Mathematically >= 0; clamp the round-off of (near-)identical distributions.
    return max(float(value), 0.0)


def feature_statistics(features: Tensor) -> tuple[Tensor, Tensor]:
    """Mean (F,) and unbiased covariance (F, F) of features (N, F), both float64 on CPU."""
    if features.ndim != 2:
        raise ValueError(f"features must have shape (N, F), got {tuple(features.shape)}")
    if features.shape[0] < 2:
        raise ValueError(f"need at least 2 feature vectors for a covariance, got {features.shape[0]}")
    features = features.detach().to(torch.float64).cpu()
    mu = features.mean(dim=0)
    centered = features - mu
    sigma = centered.T @ centered / (features.shape[0] - 1)
    return mu, sigma


def frechet_distance_from_features(feats_a: Tensor, feats_b: Tensor) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets (N_a, F) and (N_b, F)."""
    return frechet_distance(*feature_statistics(feats_a), *feature_statistics(feats_b))
