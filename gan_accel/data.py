"""Image data for GAN training: MNIST as one uint8 tensor, a fast batched loader, an offline fallback.

The fast path keeps the whole data set in memory as uint8 (47 MB for MNIST) and converts to float in
[-1, 1] once per *batch*. torchvision's usual path builds a PIL image and runs ``ToTensor`` +
``Normalize`` for every item, which costs more CPU time than a small GAN step on a GPU.

``make_dataloader`` returns a real ``torch.utils.data.DataLoader`` so ``accelerator.prepare`` can shard
it like any other loader; all state lives in the dataset and ``collate_fn``, which ``prepare`` keeps.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

__all__ = [
    "DatasetInfo",
    "DatasetUnavailableError",
    "UInt8ImageDataset",
    "collate_uint8_batch",
    "load_mnist_uint8",
    "make_dataloader",
    "resolve_dataset",
    "synthetic_digits",
    "uint8_to_float",
]

PathLike = str | os.PathLike

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


# --------------------------------------------------------------------------------------------------
# MNIST
# --------------------------------------------------------------------------------------------------


def load_mnist_uint8(data_dir: PathLike, train: bool = True, download: bool = True) -> tuple[Tensor, Tensor]:
    """Load MNIST with torchvision once; return images uint8 (N, 1, 28, 28) and labels int64 (N,).

    Raises whatever torchvision raises when the files are missing and cannot be downloaded.
    """
    from torchvision.datasets import MNIST  # local: torchvision import is slow and only needed here

    ds = MNIST(os.fspath(data_dir), train=train, download=download)
    # ``ds.data`` is already the decoded uint8 array; taking it directly skips the per-item PIL path.
    images = ds.data.to(torch.uint8).unsqueeze(1).contiguous()
    labels = ds.targets.to(torch.int64)
    return images, labels


# --------------------------------------------------------------------------------------------------
# Fast in-memory loader
# --------------------------------------------------------------------------------------------------


def uint8_to_float(images: Tensor) -> Tensor:
    """uint8 images in [0, 255] -> float32 in [-1, 1] (same as ``ToTensor`` + ``Normalize(0.5, 0.5)``)."""
    return images.float().div(127.5).sub(1)


class UInt8ImageDataset(Dataset):
    """Map-style dataset over uint8 images (N, C, H, W) and labels (N,), with a batched fetch.

    ``__getitems__`` is PyTorch's batched-fetch hook: when a dataset defines it, the DataLoader's map
    fetcher calls it once per batch with the list of indices instead of calling ``__getitem__`` per
    index, so a batch is one ``index_select`` rather than B Python calls plus a stack.
    """

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(f"labels must be (N,) with N={images.shape[0]}, got {tuple(labels.shape)}")
        self.images = images.contiguous()
        self.labels = labels.to(torch.int64)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.images.index_select(0, idx), self.labels.index_select(0, idx)


def collate_uint8_batch(batch: Any) -> tuple[Tensor, Tensor]:
    """Turn a fetched batch into ``(float32 images in [-1, 1], int64 labels)``.

    Accepts the ``(images, labels)`` pair from ``__getitems__`` or, should a wrapper hide that hook,
    a list of per-item pairs. Module-level (not a lambda) so worker processes can pickle it.
    """
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], Tensor) and batch[0].dim() == 4:
        images, labels = batch
    else:
        images = torch.stack([item[0] for item in batch])
        labels = torch.stack([torch.as_tensor(item[1]) for item in batch])
    return uint8_to_float(images), labels.to(torch.int64)


def make_dataloader(
    images_uint8: Tensor,
    labels: Tensor,
    batch_size: int,
    shuffle: bool = True,
    drop_last: bool = True,
    num_workers: int = 0,
    *,
    generator: torch.Generator | None = None,
    pin_memory: bool = False,
) -> DataLoader:
    """Fast loader over uint8 images: batches of ``(float32 (B,C,H,W) in [-1, 1], int64 (B,))``.

    A genuine ``DataLoader`` on purpose: ``accelerator.prepare`` only shards DataLoaders, and it
    rebuilds them from ``dataset``/``collate_fn``/sampler, which is where all the state is.
    ``drop_last=True`` by default because GAN steps with BatchNorm dislike a tiny final batch.
    Pass a seeded ``generator`` for a reproducible shuffle.
    """
    return DataLoader(
        UInt8ImageDataset(images_uint8, labels),
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
        collate_fn=collate_uint8_batch,
        generator=generator,
        pin_memory=pin_memory,
        # Keeping workers alive avoids re-sending the image tensor to fresh workers every epoch.
        persistent_workers=num_workers > 0,
    )


# --------------------------------------------------------------------------------------------------
# Offline digits
# --------------------------------------------------------------------------------------------------

_OVERSAMPLE = 4  # glyph templates are rendered at 4x the output size so warping stays smooth
_STROKE_RADII = (0, 1, 2)  # dilation radius in template pixels per 28 px of output


@functools.lru_cache(maxsize=4)
def _glyph_templates(size: int) -> Tensor:
    """Float templates (10 digits * len(_STROKE_RADII), 1, 4*size, 4*size) in [0, 1], MNIST-framed.

    MNIST fits each digit's bounding box into 20x20 and puts its centre of mass at the centre of the
    28x28 frame; the templates follow that so an identity warp already looks like MNIST.
    Rendering happens once per size (cached); everything per-sample is done with batched tensors.
    """
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    side = _OVERSAMPLE * size
    box = round(side * 20 / 28)
    try:
        font = ImageFont.load_default(size=side)  # Pillow >= 10.1 with FreeType: scalable font
    except (TypeError, ImportError, OSError):
        font = ImageFont.load_default()  # very old Pillow or no FreeType: small bitmap font, upscaled

    templates = []
    for digit in range(10):
        canvas = Image.new("L", (2 * side, 2 * side))
        ImageDraw.Draw(canvas).text((side, side), str(digit), fill=255, font=font, anchor="mm")
        glyph = canvas.crop(canvas.getbbox())
        scale = box / max(glyph.size)
        glyph = glyph.resize((max(1, round(glyph.width * scale)), max(1, round(glyph.height * scale))), Image.LANCZOS)
        for radius in _STROKE_RADII:
            r = round(radius * size / 28)
            # Dilation (MaxFilter) thickens the stroke the same way for any font, bitmap or vector;
            # pad first so the thicker glyph is not clipped.
            pad = Image.new("L", (glyph.width + 2 * r, glyph.height + 2 * r))
            pad.paste(glyph, (r, r))
            if r > 0:
                pad = pad.filter(ImageFilter.MaxFilter(2 * r + 1))
            t = torch.frombuffer(bytearray(pad.tobytes()), dtype=torch.uint8).view(pad.height, pad.width).float() / 255
            # Centre of mass -> frame centre, as MNIST does.
            ys = torch.arange(t.shape[0], dtype=torch.float32)
            xs = torch.arange(t.shape[1], dtype=torch.float32)
            mass = t.sum()
            cy, cx = float((t.sum(1) * ys).sum() / mass), float((t.sum(0) * xs).sum() / mass)
            top, left = round(side / 2 - cy - 0.5), round(side / 2 - cx - 0.5)
            frame = torch.zeros(side, side)
            y0, x0 = max(top, 0), max(left, 0)
            y1, x1 = min(top + t.shape[0], side), min(left + t.shape[1], side)
            frame[y0:y1, x0:x1] = t[y0 - top : y1 - top, x0 - left : x1 - left]
            templates.append(frame)
    return torch.stack(templates).unsqueeze(1)


def _random_blur(x: Tensor, mix: Tensor) -> Tensor:
    """Blend each image with its [1, 2, 1]^2 / 16 blur by ``mix`` (per image); separable shifts, no conv."""
    p = F.pad(x, (1, 1, 1, 1))
    h = p[..., :, :-2] + 2 * p[..., :, 1:-1] + p[..., :, 2:]
    blurred = (h[..., :-2, :] + 2 * h[..., 1:-1, :] + h[..., 2:, :]) / 16
    m = mix.view(-1, 1, 1, 1)
    return (1 - m) * x + m * blurred


def synthetic_digits(n: int, seed: int = 0, size: int = 28) -> tuple[Tensor, Tensor]:
    """Offline MNIST-like digits: uint8 images (n, 1, size, size), white on black, and int64 labels.

    Digits 0-9 from Pillow's bundled font with random stroke width, rotation (+-15 deg), scale,
    aspect, shear, translation, blur, contrast and ink noise. Deterministic for a seed; classes are balanced
    (every class present once n >= 10). Not a substitute for MNIST when comparing scores.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    g = torch.Generator().manual_seed(seed)
    templates = _glyph_templates(size)
    n_strokes = len(_STROKE_RADII)

    # Balanced labels in random order: a GAN trained on this should see every class equally often.
    labels = (torch.arange(n) % 10)[torch.randperm(n, generator=g)]
    stroke = torch.randint(0, n_strokes, (n,), generator=g)

    def uniform(lo: float, hi: float) -> Tensor:
        return torch.rand(n, generator=g) * (hi - lo) + lo

    angle = uniform(-15, 15) * math.pi / 180
    scale = uniform(0.8, 1.05)
    aspect = uniform(0.75, 1.05)
    shear = uniform(-0.3, 0.3)
    shift = (torch.rand(n, 2, generator=g) * 4 - 2) * 2 / size  # +-2 px, in normalised coordinates
    blur_mix = uniform(0.0, 0.7)
    contrast = uniform(1.0, 1.4)  # > 1 saturates stroke cores, as in MNIST where most ink is ~255

    # Forward map template -> output is A = R(angle) @ Shear @ diag(scale * aspect, scale), plus shift;
    # affine_grid wants the inverse (output coordinates -> where to read in the template).
    cos, sin = angle.cos(), angle.sin()
    rot = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
    shear_m = torch.zeros(n, 2, 2)
    shear_m[:, 0, 0] = shear_m[:, 1, 1] = 1
    shear_m[:, 0, 1] = shear
    forward = rot @ shear_m @ torch.diag_embed(torch.stack([scale * aspect, scale], -1))
    inverse = torch.linalg.inv(forward)
    theta = torch.cat([inverse, -(inverse @ shift.unsqueeze(-1))], dim=-1)

    # Output pixel centres in normalised coordinates (align_corners=False convention), as (x, y, 1) rows,
    # sampled at 2x the output size and average-pooled afterwards: cheap anti-aliasing of the 4x template.
    hi = 2 * size
    c = (torch.arange(hi, dtype=torch.float32) + 0.5) / hi * 2 - 1
    base = torch.stack([c.expand(hi, hi), c[:, None].expand(hi, hi), torch.ones(hi, hi)], -1).view(-1, 3)
    template_idx = labels * n_strokes + stroke

    out = torch.empty(n, 1, size, size, dtype=torch.uint8)
    chunk = 16384  # bounds memory (~50 MB of floats); large chunks mean few, large tensor ops
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        b = stop - start
        x = torch.empty(b, 1, size, size)
        tidx = template_idx[start:stop]
        for t in tidx.unique().tolist():
            sel = (tidx == t).nonzero().squeeze(1)
            k = sel.numel()
            # One (2k, 3) @ (3, hi*hi) matmul: far faster on CPU than affine_grid's batched K=3 matmul.
            grid = (theta[start + sel].reshape(2 * k, 3) @ base.T).view(k, 2, hi, hi).permute(0, 2, 3, 1)
            grid = grid.reshape(1, k * hi, hi, 2)
            # All k samples of one template in a single call: their grids are stacked along the height
            # axis, so the template is read in place instead of being copied once per sample.
            warped = F.grid_sample(templates[t : t + 1], grid, mode="bilinear", align_corners=False)
            x[sel] = F.avg_pool2d(warped.view(k, 1, hi, hi), 2)
        x = _random_blur(x, blur_mix[start:stop])
        # Multiplicative noise only touches ink, so the background stays exactly 0 like MNIST.
        x = x * (1 + 0.05 * torch.randn(x.shape, generator=g))
        peak = x.amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)
        x = (x / peak * contrast[start:stop].view(b, 1, 1, 1)).clamp_(0, 1)
        # MNIST's background is exactly 0; without this the bilinear/blur halo would tint a third of it.
        x = x.masked_fill_(x < 8 / 255, 0)
        out[start:stop] = x.mul_(255).round_().to(torch.uint8)
    return out, labels


# --------------------------------------------------------------------------------------------------
# Choosing a data set
# --------------------------------------------------------------------------------------------------


class DatasetUnavailableError(RuntimeError):
    """The requested data set could not be loaded (and no fallback was allowed)."""


@dataclass(frozen=True)
class DatasetInfo:
    """A resolved data set: ``name`` is "mnist" or "offline-digits"; ``source`` says where it came from."""

    name: str
    images: Tensor  # uint8 (N, 1, H, W)
    labels: Tensor  # int64 (N,)
    source: str

    def __len__(self) -> int:
        return self.images.shape[0]

    def __repr__(self) -> str:  # the default repr would print both tensors
        return f"DatasetInfo(name={self.name!r}, images={tuple(self.images.shape)}, source={self.source!r})"


@contextlib.contextmanager
def _socket_timeout(seconds: float | None) -> Iterator[None]:
    # torchvision's downloader uses urllib without a timeout; with a black-holed network each of its
    # mirrors could hang for minutes. A default socket timeout turns that into a quick failure.
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _short_reason(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"


def resolve_dataset(
    name: str,
    data_dir: PathLike,
    download: bool = True,
    allow_fallback: bool = True,
    log: Callable[[str], Any] | None = print,
    *,
    accelerator: Any | None = None,
    train: bool = True,
    offline_size: int = 60_000,
    seed: int = 0,
    download_timeout: float = 15.0,
) -> DatasetInfo:
    """Resolve ``name`` ("mnist", "auto" or "digits") to images and labels.

    "mnist": MNIST from ``data_dir`` (downloaded when missing and ``download``), else
    ``DatasetUnavailableError``. "auto": the same, but on failure logs one message and returns the
    offline digits (unless ``allow_fallback=False``). "digits": the offline set directly.
    With ``accelerator``, the main process loads (and downloads) first, the others then read the files.
    """
    key = name.lower()
    if key not in ("mnist", "auto", "digits"):
        raise ValueError(f"unknown dataset {name!r}: choose 'mnist', 'auto' or 'digits'")
    if key == "digits":
        return _offline(offline_size, seed)

    raw_dir = os.path.join(os.fspath(data_dir), "MNIST", "raw")
    first = accelerator.main_process_first() if accelerator is not None else contextlib.nullcontext()
    timeout = _socket_timeout(download_timeout) if download else contextlib.nullcontext()
    missing = [f for f in MNIST_FILES if not os.path.exists(os.path.join(raw_dir, f))]
    error: BaseException | None = None
    with first:
        # The error is caught *inside* main_process_first: letting it escape would skip the barrier
        # at the end of that block on the main process and leave the other processes waiting forever.
        try:
            with timeout:
                images, labels = load_mnist_uint8(data_dir, train=train, download=download)
        except (RuntimeError, OSError, EOFError, ValueError) as exc:
            # RuntimeError: torchvision's "not found" / all mirrors failed; OSError covers URLError,
            # timeouts and permissions; EOFError/ValueError: truncated or corrupt files.
            error = exc
    if error is None:
        return DatasetInfo("mnist", images, labels, source=raw_dir)

    if not missing:
        state = "files present but unreadable"
    else:
        state = "files missing, " + ("download failed" if download else "download disabled")
    what = f"Could not load MNIST from {raw_dir} ({state}; {_short_reason(error)})."
    how = (
        f"To use real MNIST, put {', '.join(MNIST_FILES)} (or their .gz) in {raw_dir}, "
        "or run once with network access so it can be downloaded."
    )
    if key == "mnist" or not allow_fallback:
        raise DatasetUnavailableError(f"{what} {how} The built-in offline digits are dataset 'digits'.") from error
    if log is not None and (accelerator is None or accelerator.is_main_process):
        log(
            f"{what} Falling back to the built-in offline digit set (synthetic digits rendered from "
            f"Pillow's font; NOT MNIST, scores are not comparable). {how}"
        )
    return _offline(offline_size, seed)


def _offline(n: int, seed: int) -> DatasetInfo:
    images, labels = synthetic_digits(n, seed=seed)
    return DatasetInfo("offline-digits", images, labels, source=f"gan_accel.data.synthetic_digits(n={n}, seed={seed})")
