"""Samples of a trained G without the trainer: what ``gan-accel sample`` and ``gan-accel eval`` use.

    G = gan_accel.load_generator("runs/conditional_mnist")          # or a checkpoint, an export, a Hub repo
    images, labels = sample_images(G, num=100, label=3)             # 100 threes
    walks = interpolate(G, walks=8, steps=10)                        # 8 latent walks of 10 images each
    images, _ = sample_images(G, seeds=[0, 1, 2, 40], truncation=0.7)  # one image per seed, truncated

A conditional G (one with ``G.num_classes``) samples one class, or every class in equal numbers.

Seeds and truncation. Seed ``s`` is the latent ``torch.randn(1, z_dim)`` drawn on the CPU from
``torch.Generator().manual_seed(s)``: the same latent whatever the other seeds asked for, and the one image that
``num=1, seed=s`` gives. Truncation (the trick of BigGAN and StyleGAN) moves each latent towards the mean latent,
``mean + psi * (z - mean)``: psi 1 changes nothing, a smaller psi gives less varied images. The mean is
taken where the latent enters G's layers; none of gan_accel's families (dcgan, resnet, r3gan, mlp) has a mapping
network, so that is z itself, whose mean under the Gaussian prior is 0, and the trick is ``psi * z`` (a
conditional G's class embedding is left as it is).
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConfigError

MAX_WALKS = MAX_STEPS = 100  # an interpolation grid: at most 100 walks (rows) of 100 steps (columns)
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


def truncate(z: torch.Tensor, truncation: float) -> torch.Tensor:
    """The latents moved towards the mean latent, 0 for every gan_accel family (see the module docstring)."""
    return z if truncation == 1.0 else z * truncation


def check_seeds(seeds: list[int], num_classes: int | None, label: int | None) -> None:
    """Refuse, in one line, a seed list the run cannot sample (before any work)."""
    if not seeds:
        raise ConfigError("no seeds to sample: pass at least one (e.g. seeds=[0, 1, 2])")
    check_sample_request(num_classes, len(seeds), label)
    if num_classes is not None and label is None:
        raise ConfigError("a conditional run samples a seed in one class: pass a label (--label) with the seeds")


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
def iter_samples(G: nn.Module, num: int | None = None, label: int | None = None, seed: int = 0,
                 seeds: list[int] | None = None,
                 truncation: float = 1.0) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """The samples of :func:`sample_images`, chunk by chunk: ``(images, labels)`` of at most a few hundred
    samples at a time, so any ``num`` up to :data:`MAX_SAMPLES` runs in the memory of one chunk. The latents are
    drawn on the CPU (the same numbers on any device), then moved to G's device."""
    num_classes = classes_of(G)
    if seeds is not None:  # one sample per seed, in the order given, CHUNK seeds at a time
        seeds = list(seeds)
        check_seeds(seeds, num_classes, label)
        num, spans = len(seeds), [(start, min(start + CHUNK, len(seeds))) for start in range(0, len(seeds), CHUNK)]
    else:
        num = 64 if num is None else num
        check_sample_request(num_classes, num, label)
        spans = _chunks(sample_count(num_classes, num, label), G.z_dim)
    generator = torch.Generator().manual_seed(seed)
    device = next(G.parameters()).device
    for start, stop in spans:
        if seeds is None:
            z = torch.randn(stop - start, G.z_dim, generator=generator)
        else:  # each seed's own latent, whatever the other seeds
            z = torch.cat([torch.randn(1, G.z_dim, generator=torch.Generator().manual_seed(s))
                           for s in seeds[start:stop]])
        z = truncate(z, truncation).to(device)
        labels = sample_labels(num_classes, num, label, start, stop)
        yield (G(z) if labels is None else G(z, labels.to(device))), labels


def sample_images(G: nn.Module, num: int | None = None, label: int | None = None, seed: int = 0,
                  seeds: list[int] | None = None, truncation: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``num`` samples (N, C, H, W) in [-1, 1] (default 64) and their labels (None for an unconditional G), all
    at once; or with ``seeds`` one sample per seed, in their order. ``truncation``: psi of the truncation trick.

    A conditional G gives ``num`` samples of ``label``, or without one ``num // num_classes`` of each class
    (``seeds`` need a ``label``). Raises :class:`ConfigError` for a label the run cannot take, or more than
    :data:`MAX_SAMPLES`.
    """
    parts = list(iter_samples(G, num, label, seed, seeds, truncation))
    images = torch.cat([images for images, _ in parts])
    return images, (None if parts[0][1] is None else torch.cat([labels for _, labels in parts]))


def slerp(z0: torch.Tensor, z1: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Spherical interpolation from each row of ``z0`` (W, D) to the same row of ``z1`` at the fractions ``t`` (S,):
    (W, S, D). The angle is the one between the normalised endpoints, and the weights apply to the latents as
    drawn (White, "Sampling Generative Networks", 2016): the path keeps near the norm ``sqrt(D)`` of Gaussian
    latents, where a straight line passes through shorter latents that G never saw. ``t = 0`` and ``1`` give
    ``z0`` and ``z1`` exactly; endpoints in (almost) the same direction are joined by a straight line."""
    cosine = F.cosine_similarity(z0, z1, dim=1).clamp(-1.0, 1.0)[:, None, None]
    omega, t = torch.acos(cosine), t.to(z0)[None, :, None]
    sine = torch.sin(omega)
    parallel = sine.abs() < 1e-6
    safe = torch.where(parallel, torch.ones_like(sine), sine)
    w0 = torch.where(parallel, 1 - t, torch.sin((1 - t) * omega) / safe)
    w1 = torch.where(parallel, t, torch.sin(t * omega) / safe)
    return w0 * z0[:, None] + w1 * z1[:, None]


def walk_count(num_classes: int | None, walks: int | None, label: int | None) -> int:
    """``walks``, or by default 8, or in a conditional run without a label one per class (at most 100)."""
    if walks is not None:
        return walks
    return 8 if num_classes is None or label is not None else min(num_classes, MAX_WALKS)


@torch.no_grad()
def interpolate(G: nn.Module, walks: int | None = None, steps: int = 10, label: int | None = None,
                seed: int = 0, truncation: float = 1.0) -> torch.Tensor:
    """Latent walks: (walks * steps, C, H, W) images in [-1, 1], walk by walk (one grid row each), ``steps``
    points of :func:`slerp` from one Gaussian latent to another (its first and last images are ``G`` of those two).

    The endpoints are drawn from ``seed`` on the CPU, walk by walk (``randn(walks, 2, z_dim)``). A conditional G
    walks in ``label``, or without one walk ``i`` stays in class ``i % num_classes``; ``walks`` defaults to 8, or one
    per class (at most :data:`MAX_WALKS`). ``truncation`` scales the whole walk towards the mean latent (slerp's
    weights depend on the angle only, so truncating the ends or the path is the same). Raises
    :class:`ConfigError` for a count or label the run cannot take.
    """
    num_classes = classes_of(G)
    walks = walk_count(num_classes, walks, label)
    for name, value, low, high in (("walks", walks, 1, MAX_WALKS), ("steps", steps, 2, MAX_STEPS)):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(f"{name}={value!r}: ask for {low} to {high} {name} per grid")
    check_sample_request(num_classes, walks * steps, label)
    ends = torch.randn(walks, 2, G.z_dim, generator=torch.Generator().manual_seed(seed))
    z = slerp(ends[:, 0], ends[:, 1], torch.linspace(0, 1, steps, dtype=ends.dtype)).reshape(walks * steps, G.z_dim)
    z = truncate(z, truncation)
    labels = None if num_classes is None else (torch.arange(walks) % num_classes if label is None else
                                               torch.full((walks,), label)).repeat_interleave(steps)
    weight = next(G.parameters())
    images = []
    for start in range(0, len(z), CHUNK):  # memory of one chunk of G's activations, whatever the grid
        part = z[start:start + CHUNK].to(weight)  # G's device and dtype
        images.append(G(part) if labels is None else G(part, labels[start:start + CHUNK].to(weight.device)))
    return torch.cat(images)
