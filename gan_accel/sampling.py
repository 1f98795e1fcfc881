"""Fixed noise and image grids.

The fixed noise is drawn from its own seeded CPU generator, so it is identical on every process
and independent of the training RNG stream (drawing it does not shift the noise used for training).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch
from torchvision.utils import make_grid, save_image

from .files import atomic_path

LatentSampler = Callable[[int, torch.device], torch.Tensor]


def fixed_noise(num_samples: int, z_dim: int, seed: int) -> torch.Tensor:
    """Noise for progress grids: the same tensor on every process for a given seed (on CPU)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_samples, z_dim, generator=generator)


def gaussian_latents(z_dim: int) -> LatentSampler:
    """The default latent sampler: standard normal noise made directly on the training device."""

    def sample(batch_size: int, device: torch.device) -> torch.Tensor:
        return torch.randn(batch_size, z_dim, device=device)

    return sample


def to_grid(images: torch.Tensor, nrow: int | None = None) -> torch.Tensor:
    """Arrange a batch of images in [-1, 1] as one [0, 1] grid image (C, H, W), on CPU."""
    images = images.detach().float().cpu().clamp(-1.0, 1.0)
    nrow = nrow or max(1, int(round(images.shape[0] ** 0.5)))
    return make_grid(images, nrow=nrow, normalize=True, value_range=(-1.0, 1.0), padding=2)


def save_grid(images: torch.Tensor, path: str | os.PathLike, nrow: int | None = None) -> Path:
    """Write a PNG grid atomically (temporary file then rename), so a reader never sees half a file."""
    with atomic_path(path) as tmp:
        save_image(to_grid(images, nrow), tmp, format="png")
    return Path(path)


def save_gif(frames: list[str | os.PathLike], path: str | os.PathLike, frame_ms: int = 250, hold_last_ms: int = 1500) -> Path:
    """An animated GIF of image files (e.g. the fixed-noise grids in step order), written atomically."""
    from PIL import Image

    if not frames:
        raise ValueError("no frames to animate")
    images = [Image.open(frame).convert("RGB") for frame in frames]
    durations = [frame_ms] * (len(images) - 1) + [hold_last_ms]
    with atomic_path(path) as tmp:
        images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
    return Path(path)
