"""Samples of a trained G without the trainer: what ``gan-accel sample`` and ``gan-accel eval`` use.

    G = gan_accel.load_generator("runs/conditional_mnist")          # or a checkpoint, an export, a Hub repo
    images, labels = sample_images(G, num=100, label=3)             # 100 threes

A conditional G (one with ``G.num_classes``) samples one class, or every class in equal numbers.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from .errors import ConfigError

MAX_SAMPLES = 10_000_000  # what one call may ask for: a hard bound, said in one line, before any work
CHUNK = 512  # samples made (latents drawn, G run) at a time: memory does not grow with the number asked for


def classes_of(G: nn.Module) -> int | None:
    """G's number of classes (None for an unconditional G)."""
    return getattr(G, "num_classes", None)


def check_sample_request(num_classes: int | None, num: int, label: int | None = None) -> None:
    """Refuse, in one line, a number of samples or a label the run cannot give (before any work)."""
    if not isinstance(num, int) or isinstance(num, bool) or not 1 <= num <= MAX_SAMPLES:
        raise ConfigError(f"num={num!r} samples: ask for 1 to {MAX_SAMPLES:,} at a time (several calls with other "
                          "seeds give more)")
    if label is not None and num_classes is None:
        raise ConfigError("this run is unconditional (no num_classes): it cannot sample a chosen class; "
                          "leave out the label")
    if label is not None and not 0 <= label < num_classes:
        raise ConfigError(f"label {label} is outside the run's classes 0..{num_classes - 1}")


def sample_count(num_classes: int | None, num: int, label: int | None = None) -> int:
    """How many samples :func:`iter_samples` gives: ``num``, or for a conditional run without a label
    ``num // num_classes`` of each class (at least one)."""
    if num_classes is None or label is not None:
        return num
    return num_classes * max(1, num // num_classes)


def sample_labels(num_classes: int | None, num: int, label: int | None, start: int, stop: int) -> torch.Tensor | None:
    """The labels of samples ``start`` to ``stop`` (class by class), None for an unconditional run."""
    if num_classes is None:
        return None
    if label is not None:
        return torch.full((stop - start,), label, dtype=torch.long)
    return torch.arange(start, stop) // max(1, num // num_classes)


def _chunks(count: int, width: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of the chunks of ``count`` latents of ``width`` numbers each.

    ``torch.randn`` on the CPU draws in blocks of 16 numbers and redraws its last 16 when n is no multiple of 16:
    chunks of a multiple of 16 rows and a last one of at least 16 numbers draw what one call would draw.
    """
    start = 0
    while start < count:
        take = min(CHUNK, count - start)
        if 0 < (count - start - take) * width < 16:
            take = count - start
        yield start, start + take
        start += take


@torch.no_grad()
def iter_samples(G: nn.Module, num: int, label: int | None = None,
                 seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """The samples of :func:`sample_images`, chunk by chunk: ``(images, labels)`` of at most a few hundred
    samples at a time, so any ``num`` up to :data:`MAX_SAMPLES` runs in the memory of one chunk. The latents are
    drawn on the CPU (the same numbers on any device), then moved to G's device."""
    num_classes = classes_of(G)
    check_sample_request(num_classes, num, label)
    count = sample_count(num_classes, num, label)
    generator = torch.Generator().manual_seed(seed)
    device = next(G.parameters()).device
    for start, stop in _chunks(count, G.z_dim):
        z = torch.randn(stop - start, G.z_dim, generator=generator).to(device)
        labels = sample_labels(num_classes, num, label, start, stop)
        yield (G(z) if labels is None else G(z, labels.to(device))), labels


def sample_images(G: nn.Module, num: int, label: int | None = None,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``num`` samples (N, C, H, W) in [-1, 1] and their labels (None for an unconditional G), all at once.

    A conditional G gives ``num`` samples of ``label``, or without one ``num // num_classes`` of each class.
    Raises :class:`ConfigError` for a label the run cannot take, or more than :data:`MAX_SAMPLES`.
    """
    parts = list(iter_samples(G, num, label, seed))
    images = torch.cat([images for images, _ in parts])
    return images, (None if parts[0][1] is None else torch.cat([labels for _, labels in parts]))
