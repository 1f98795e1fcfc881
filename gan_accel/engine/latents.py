"""Latent samplers and the fixed latents of the progress samples.

A latent sampler is ``sampler(batch_size, device) -> latents``: a tensor whose first dimension is
the batch, or any structure (tuple, dict) of such tensors that G takes as its one argument.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

LatentSampler = Callable[[int, torch.device], Any]
LabelSampler = Callable[[int, torch.device], torch.Tensor]  # (batch_size, device) -> class indices (batch_size,)


def gaussian_latents(z_dim: int) -> LatentSampler:
    """The default sampler: standard normal noise of shape ``(batch_size, z_dim)`` on the training device."""

    def sample(batch_size: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch_size, z_dim, device=device)

    return sample


def uniform_labels(num_classes: int) -> LabelSampler:
    """The default label sampler of a conditional run: every class equally often."""

    def sample(batch_size: int, device: torch.device) -> torch.Tensor:
        return torch.randint(num_classes, (batch_size,), device=device)

    return sample


def draw_fixed_latents(sampler: LatentSampler, num_samples: int, seed: int) -> Any:
    """The latents of the progress samples, drawn on CPU from ``seed`` with a forked RNG: identical on every
    process, and the training noise is not shifted."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return map_tensors(sampler(num_samples, torch.device("cpu")), lambda t: t.cpu())


def map_tensors(latents: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor of a latent structure (tensor, tuple/list, dict)."""
    if isinstance(latents, torch.Tensor):
        return fn(latents)
    if isinstance(latents, (tuple, list)):
        return type(latents)(map_tensors(item, fn) for item in latents)
    if isinstance(latents, dict):
        return {key: map_tensors(value, fn) for key, value in latents.items()}
    return latents


def leading_size(latents: Any) -> int | None:
    """The batch size of a latent structure: the first dimension of its first tensor (None if it has none)."""
    if isinstance(latents, torch.Tensor):
        return latents.shape[0] if latents.dim() > 0 else None
    items = latents.values() if isinstance(latents, dict) else latents if isinstance(latents, (tuple, list)) else ()
    return next((size for size in map(leading_size, items) if size is not None), None)


@torch.no_grad()
def generate_samples(G: Any, latents: Any, accelerator: Any, labels: torch.Tensor | None = None) -> torch.Tensor:
    """``G(latents[, labels])`` in eval mode under the run's autocast, as float32. Pass the *unwrapped* G: a DDP
    wrapper called on the main process alone could start a collective the other ranks never join."""
    param = next(G.parameters(), None)
    device = param.device if param is not None else accelerator.device
    dtype = param.dtype if param is not None and param.is_floating_point() else None
    # e.g. a float64 G gets float64 latents; autocast still applies on top
    latents = map_tensors(latents, lambda t: t.to(device, dtype if dtype and t.is_floating_point() else t.dtype))
    was_training = G.training
    G.eval()
    try:
        with accelerator.autocast():
            if labels is not None:
                return G(latents, labels.to(device)).float()
            return G(latents).float()
    finally:
        G.train(was_training)
