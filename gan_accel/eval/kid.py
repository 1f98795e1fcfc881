"""Kernel inception distance (Binkowski et al., 2018): an unbiased MMD^2 with the cubic polynomial kernel, mean
and std over random subsets (as torch-fidelity); unlike the Fréchet distance, small sets do not inflate it."""

from __future__ import annotations

import torch
from torch import Tensor


def polynomial_kernel(a: Tensor, b: Tensor) -> Tensor:
    """``(a @ b.T / d + 1) ** 3`` for feature rows a (N, d) and b (M, d)."""
    return (a @ b.T / a.shape[1] + 1.0) ** 3


def mmd2_unbiased(fake: Tensor, real: Tensor) -> float:
    """Unbiased MMD^2 of two equal-size sets (m, d) with :func:`polynomial_kernel` (diagonals left out)."""
    m = fake.shape[0]
    k_ff, k_rr, k_fr = polynomial_kernel(fake, fake), polynomial_kernel(real, real), polynomial_kernel(fake, real)
    off_diagonal = (k_ff.sum() - k_ff.diagonal().sum() + k_rr.sum() - k_rr.diagonal().sum()) / (m * (m - 1))
    return float(off_diagonal - 2 * k_fr.mean())


def subset_indices(n_fake: int, n_real: int, num_subsets: int, subset_size: int,
                   seed: int) -> list[tuple[Tensor, Tensor]]:
    """The (fake rows, real rows) of each subset: ``min(subset_size, n_fake, n_real)`` of each, drawn
    without replacement from a private generator (the global RNG is not touched)."""
    m = min(subset_size, n_fake, n_real)
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randperm(n_fake, generator=generator)[:m], torch.randperm(n_real, generator=generator)[:m])
            for _ in range(num_subsets)]


def kernel_inception_distance(fake: Tensor, real: Tensor, num_subsets: int = 100, subset_size: int = 1000,
                              seed: int = 0) -> tuple[float, float]:
    """(mean, population std) of the unbiased MMD^2 over ``num_subsets`` random subsets, in float64."""
    _check_pair(fake, real)
    if num_subsets < 1:
        raise ValueError(f"num_subsets must be >= 1, got {num_subsets}")
    if min(subset_size, len(fake), len(real)) < 2:
        raise ValueError(f"KID needs subsets of at least 2 samples; got {len(fake)} fake, {len(real)} real and "
                         f"subset_size={subset_size}")
    fake, real = fake.detach().to(torch.float64).cpu(), real.detach().to(torch.float64).cpu()
    values = torch.tensor([mmd2_unbiased(fake[f], real[r])
                           for f, r in subset_indices(len(fake), len(real), num_subsets, subset_size, seed)],
                          dtype=torch.float64)
    return float(values.mean()), float(values.std(unbiased=False))


def _check_pair(fake: Tensor, real: Tensor) -> None:
    if fake.ndim != 2 or real.ndim != 2:
        raise ValueError(f"features must be (N, F) matrices, got shapes {tuple(fake.shape)} and {tuple(real.shape)}")
    if fake.shape[1] != real.shape[1]:
        raise ValueError(f"fake and real features have different widths ({fake.shape[1]} and {real.shape[1]}): "
                         "compute both with the same extractor")
