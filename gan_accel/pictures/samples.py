"""Pictures of samples: image grids, scatter plots of 2-D points, and animated GIFs of them.

Drawn with torchvision and Pillow only (no plotting library), always written atomically.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..state.files import atomic_path
from .charts import PlotArea


def is_image_batch(samples: torch.Tensor) -> bool:
    """(N, C, H, W) with 1, 3 or 4 channels: shown as an image grid."""
    return samples.dim() == 4 and samples.shape[1] in (1, 3, 4)


def is_point_batch(samples: torch.Tensor) -> bool:
    """(N, 2): shown as a scatter plot."""
    return samples.dim() == 2 and samples.shape[1] == 2


def to_grid(images: torch.Tensor, nrow: int | None = None) -> torch.Tensor:
    """Arrange a batch of images in [-1, 1] as one [0, 1] grid image (C, H, W), on CPU."""
    from torchvision.utils import make_grid  # torchvision loads its datasets on import: only when drawing

    images = images.detach().float().cpu().clamp(-1.0, 1.0)
    nrow = nrow or max(1, int(round(images.shape[0] ** 0.5)))
    return make_grid(images, nrow=nrow, normalize=True, value_range=(-1.0, 1.0), padding=2)


def save_grid(images: torch.Tensor, path: str | os.PathLike, nrow: int | None = None) -> Path:
    """Write a PNG grid atomically (temporary file then rename), so a reader never sees half a file."""
    from torchvision.utils import save_image

    with atomic_path(path) as tmp:
        save_image(to_grid(images, nrow), tmp, format="png")
    return Path(path)


def save_scatter(points: torch.Tensor, path: str | os.PathLike, reference: torch.Tensor | None = None,
                 title: str | None = None, size: int = 480) -> Path:
    """A scatter plot PNG of 2-D points (blue), with ``reference`` points (orange, e.g. real data) on top.

    The axes are square and fitted to the reference (or to the points), padded by 15%; points
    outside are drawn on the border, so a sample far off the data is still visible.
    """
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
