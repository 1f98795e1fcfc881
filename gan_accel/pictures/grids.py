"""Pictures of samples: image grids, scatter plots of 2-D points, and animated GIFs of them (torchvision and
Pillow only, written atomically)."""

from __future__ import annotations

import io
import os
import struct
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Iterable

import torch

from ..storage.files import atomic_path
from ..storage.reading import MAX_IMAGE_BYTES, open_file
from .charts import PlotArea

if TYPE_CHECKING:
    from PIL import Image


def is_image_batch(samples: torch.Tensor) -> bool:
    """(N, C, H, W) with 1, 3 or 4 channels: shown as an image grid."""
    return samples.dim() == 4 and samples.shape[1] in (1, 3, 4)


def is_point_batch(samples: torch.Tensor) -> bool:
    """(N, 2): shown as a scatter plot."""
    return samples.dim() == 2 and samples.shape[1] == 2


def to_grid(images: torch.Tensor, nrow: int | None = None) -> torch.Tensor:
    """Arrange a batch of images in [-1, 1] as one [0, 1] grid image (C, H, W), on CPU: rows of ``nrow`` (default:
    a square). Rows far more numerous than wide (a row per class of many classes) are wrapped into blocks side by
    side, so the grid stays about square: its sides grow as the square root of the count, never as the count."""
    from torchvision.utils import make_grid  # torchvision loads its datasets on import: only when drawing

    images = images.detach().float().cpu().clamp(-1.0, 1.0)
    nrow = nrow or max(1, int(round(images.shape[0] ** 0.5)))
    rows = -(-images.shape[0] // nrow)
    blocks = max(1, int(round((rows / nrow) ** 0.5))) if rows > max(STRIP_ROWS, 4 * nrow) else 1
    if blocks > 1:
        images, nrow = _wrap_rows(images, nrow, blocks), nrow * blocks
    return make_grid(images, nrow=nrow, normalize=True, value_range=(-1.0, 1.0), padding=2)


STRIP_ROWS = 32  # more rows than this, and more than 4x the columns: wrapped (to_grid)


def _wrap_rows(images: torch.Tensor, nrow: int, blocks: int) -> torch.Tensor:
    """The images reordered so that rows of ``nrow`` read down ``blocks`` side-by-side blocks (blank where none)."""
    rows = -(-images.shape[0] // nrow)
    height = -(-rows // blocks)
    blank = torch.full_like(images[0], -1.0)
    order = []
    for r in range(height):
        for b in range(blocks):
            start = (b * height + r) * nrow
            order += [images[i] if i < images.shape[0] and b * height + r < rows else blank
                      for i in range(start, start + nrow)]
    return torch.stack(order)


def png_grid(images: torch.Tensor, nrow: int | None = None) -> bytes:
    """The PNG bytes of the grid :func:`save_grid` writes (for files written with others, or sent)."""
    from torchvision.utils import save_image

    buffer = io.BytesIO()
    save_image(to_grid(images, nrow), buffer, format="png")
    return buffer.getvalue()


def save_grid(images: torch.Tensor, path: str | os.PathLike, nrow: int | None = None) -> Path:
    """Write a PNG grid atomically (temporary file then rename), so a reader never sees half a file."""
    from torchvision.utils import save_image

    with atomic_path(path) as tmp:
        save_image(to_grid(images, nrow), tmp, format="png")
    return Path(path)


def save_scatter(points: torch.Tensor, path: str | os.PathLike, reference: torch.Tensor | None = None,
                 title: str | None = None, size: int = 480) -> Path:
    """A scatter plot PNG of 2-D points (blue), with ``reference`` points (orange, e.g. real data) on top, on
    square axes fitted to the reference; points outside are drawn on the border, so they stay visible."""
    from PIL import Image, ImageDraw

    pts = points.detach().float().cpu()
    ref = reference.detach().float().cpu() if reference is not None else None
    basis = ref if ref is not None and len(ref) else pts
    finite = basis[torch.isfinite(basis).all(1)]
    if len(finite) == 0:
        finite = torch.zeros(1, 2)
    centre = (finite.amax(0) + finite.amin(0)) / 2
    half = float((finite.amax(0) - finite.amin(0)).max()) / 2 * 1.15 or 1.0
    low_x, low_y = float(centre[0]) - half, float(centre[1]) - half
    margin, inner = 48, size - 64
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    area = PlotArea(draw, (margin, margin - 16, margin + inner, margin - 16 + inner),
                    (low_x, low_x + 2 * half), (low_y, low_y + 2 * half), clamp=True)
    area.draw_axes()
    # Samples first, real points on top, small: a collapsed or shifted mode shows as orange without blue.
    for batch, colour, radius in ((pts, (31, 90, 200), 2.0), (ref, (230, 120, 20), 1.2)):
        if batch is None:
            continue
        for x, y in batch[torch.isfinite(batch).all(1)].tolist():
            px, py = area.to_pixel(x, y)
            draw.ellipse([px - radius, py - radius, px + radius, py + radius], fill=colour)
    if title:
        draw.text((size / 2, 8), title, fill="black", anchor="mt")
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG")
    return Path(path)


def save_gif(frames: Iterable[str | os.PathLike | BinaryIO], path: str | os.PathLike, frame_ms: int = 250,
             hold_last_ms: int = 1500) -> Path:
    """An animated GIF of image files (e.g. the fixed-noise grids in step order), written atomically; each frame
    shown ``frame_ms``, the last ``hold_last_ms``. Streamed one frame at a time with its own colour table
    (Pillow's own writer keeps every frame in memory until the end)."""
    paths = list(frames)
    if not paths:
        raise ValueError("no frames to animate")
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        write_gif(out, paths, frame_ms, hold_last_ms)
    return Path(path)


def write_gif(out: BinaryIO, frames: list[str | os.PathLike | BinaryIO], frame_ms: int = 250,
              hold_last_ms: int = 1500) -> None:
    """The GIF of :func:`save_gif` written to ``out``; a frame is an image file's path or an open image file."""
    from PIL import Image

    for index, frame in enumerate(frames):
        opened = open_file(frame, MAX_IMAGE_BYTES) if isinstance(frame, (str, os.PathLike)) else frame
        with opened if opened is not frame else nullcontext(), Image.open(opened) as image:
            single = io.BytesIO()
            _gif_ready(image).save(single, format="GIF")
        width, height, table, descriptor, data = _gif_parts(single.getvalue())
        if index == 0:
            out.write(b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0))  # no global table
            out.write(b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00")  # loop forever
        delay = (hold_last_ms if index == len(frames) - 1 else frame_ms) // 10  # GIF counts 1/100 s
        out.write(b"\x21\xf9\x04\x04" + struct.pack("<H", delay) + b"\x00\x00")  # disposal: keep
        out.write(descriptor + table + data)
    out.write(b"\x3b")


def _gif_ready(image: "Image.Image") -> "Image.Image":
    """The picture as GIF takes it: a grey one (every pixel R = G = B, as grids of one-channel images are) as
    one channel, exact and without the colour quantisation that costs most of the time; else RGB."""
    from PIL import ImageChops

    rgb = image.convert("RGB")
    red, green, blue = rgb.split()
    if ImageChops.difference(red, green).getbbox() is None and ImageChops.difference(red, blue).getbbox() is None:
        return red
    return rgb


def _gif_parts(gif: bytes) -> tuple[int, int, bytes, bytes, bytes]:
    """(width, height, colour table, image descriptor marked as having that table locally, image data) of the
    first image of a GIF file."""
    width, height, packed = struct.unpack_from("<HHB", gif, 6)
    at = 13
    table = b""
    if packed & 0x80:  # the global colour table: becomes the frame's local one
        table = gif[at:at + 3 * (2 << (packed & 7))]
        at += len(table)
    while gif[at] == 0x21:  # extensions (a comment, a graphic control): skipped
        at += 2
        while gif[at]:
            at += gif[at] + 1
        at += 1
    if gif[at] != 0x2C:
        raise ValueError("not a GIF image")
    descriptor = bytearray(gif[at:at + 10])
    at += 10
    if descriptor[9] & 0x80:  # a local table already
        table = gif[at:at + 3 * (2 << (descriptor[9] & 7))]
        at += len(table)
    else:
        descriptor[9] = (descriptor[9] & 0x40) | 0x80 | (packed & 7)  # keep interlacing; size of the table
    start = at
    at += 1  # LZW minimum code size, then sub-blocks up to an empty one
    while gif[at]:
        at += gif[at] + 1
    return width, height, table, bytes(descriptor), gif[start:at + 1]
