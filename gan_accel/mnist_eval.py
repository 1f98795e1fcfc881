"""Score a digit generator with a compact MNIST classifier (see :mod:`gan_accel.metrics`).

The classifier is trained once (about 30 s on 2 CPU cores) and cached under
``$GAN_ACCEL_CACHE`` (default ``~/.cache/gan_accel``), because data folders may be read-only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .data import load_mnist_uint8
from .metrics import evaluate_mnist_samples, format_evaluation, load_or_train_classifier


def cache_dir() -> Path:
    """Where trained evaluation classifiers are kept."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gan_accel"
    return Path(os.environ.get("GAN_ACCEL_CACHE", default))


@torch.no_grad()
def generate_samples(G: nn.Module, num: int, z_dim: int, device: torch.device | str, seed: int = 1234,
                     batch_size: int = 500) -> torch.Tensor:
    """``num`` images from ``G`` in eval mode, from seeded noise (the same noise for every model)."""
    generator = torch.Generator().manual_seed(seed)
    was_training = G.training
    G.eval()
    try:
        chunks = []
        for start in range(0, num, batch_size):
            z = torch.randn(min(batch_size, num - start), z_dim, generator=generator).to(device)
            chunks.append(G(z).float().cpu())
        return torch.cat(chunks)
    finally:
        G.train(was_training)


def reference_digits(data_dir: str | os.PathLike, fallback=None) -> tuple[str, tuple, tuple]:
    """(name, (train images, labels), (held-out images, labels)): real MNIST, else the fallback set."""
    try:
        return ("mnist", load_mnist_uint8(data_dir, train=True, download=False),
                load_mnist_uint8(data_dir, train=False, download=False))
    except (RuntimeError, OSError):
        if fallback is None:
            raise
    # Offline digits: train the judge on the first 5/6, compare against the last 1/6.
    cut = len(fallback.images) * 5 // 6
    return (fallback.name, (fallback.images[:cut], fallback.labels[:cut]),
            (fallback.images[cut:], fallback.labels[cut:]))


def evaluate_generator(G: nn.Module, data_dir: str | os.PathLike, z_dim: int, device: torch.device | str = "cpu",
                       fallback=None, num_samples: int = 10_000) -> dict[str, Any]:
    """Generate ``num_samples`` digits and score them against held-out real digits.

    Returns :func:`gan_accel.metrics.evaluate_mnist_samples`'s dict plus ``reference`` (which digits
    judged) and ``summary`` (a printable text).
    """
    name, (train_x, train_y), (held_x, _) = reference_digits(data_dir, fallback)
    classifier = load_or_train_classifier(cache_dir() / f"{name}_classifier.safetensors", train_x, train_y)
    samples = generate_samples(G, num_samples, z_dim, device)
    result = evaluate_mnist_samples(samples, held_x[:num_samples], classifier)
    result["reference"] = name
    result["summary"] = format_evaluation(result)
    return result
