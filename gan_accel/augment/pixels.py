"""Integer pixel moves (flips, 90-degree rotations, translations) as one gather per batch.

Each move maps an *output* pixel to the *input* pixel it copies (``(rows, cols)``, int64, (N, H, W)); a
chain composes the maps and :func:`gather_pixels` copies once: exact (an unmoved sample keeps its bytes),
differentiable (a scatter-add backward) and cheap.
"""

from __future__ import annotations

import torch
from torch import Tensor


def identity_coordinates(n: int, height: int, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Every output pixel copies itself."""
    rows = torch.arange(height, device=device).view(1, height, 1).expand(n, height, width)
    cols = torch.arange(width, device=device).view(1, 1, width).expand(n, height, width)
    return rows, cols


def _per_sample(values: Tensor) -> Tensor:
    return values.view(-1, 1, 1)


def flip_x(rows: Tensor, cols: Tensor, flip: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Mirror left-right the samples where ``flip`` (N,) is true: output (i, j) reads (i, W-1-j)."""
    return rows, torch.where(_per_sample(flip), width - 1 - cols, cols)


def rotate90(rows: Tensor, cols: Tensor, quarter_turns: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Rotate each (square) sample counter-clockwise by ``quarter_turns`` (N,) in {0, 1, 2, 3} quarter turns,
    as ``torch.rot90(x, k, dims=(2, 3))`` does: one quarter turn makes output (i, j) read (j, S-1-i)."""
    k = _per_sample(quarter_turns % 4)
    last = size - 1
    new_rows = torch.where(k == 0, rows, torch.where(k == 1, cols, torch.where(k == 2, last - rows, last - cols)))
    new_cols = torch.where(k == 0, cols, torch.where(k == 1, last - rows, torch.where(k == 2, last - cols, rows)))
    return new_rows, new_cols


def translate(rows: Tensor, cols: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
    """Move each sample's content by ``shift`` (N, 2) integer pixels (down, right): output (i, j) reads
    (i - dy, j - dx). The result may point outside the image: follow with :func:`reflect` or a fill."""
    return rows - _per_sample(shift[:, 0]), cols - _per_sample(shift[:, 1])


def reflect(index: Tensor, size: int) -> Tensor:
    """Mirror out-of-range indices back into [0, size) without repeating the edge (``numpy.pad``'s
    ``"reflect"``): -1 -> 1, size -> size - 2; any distance (the pattern repeats every 2(size - 1))."""
    if size == 1:
        return torch.zeros_like(index)
    period = 2 * (size - 1)
    folded = index.remainder(period)
    return torch.where(folded < size, folded, period - folded)


def gather_pixels(x: Tensor, rows: Tensor, cols: Tensor, fill_outside: bool = False) -> Tensor:
    """``out[n, c, i, j] = x[n, c, rows[n, i, j], cols[n, i, j]]``; ``fill_outside``: coordinates outside the
    image give 0 (zero padding), else they must be in range."""
    n, channels, height, width = x.shape
    inside = None
    if fill_outside:
        inside = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
        rows, cols = rows.clamp(0, height - 1), cols.clamp(0, width - 1)
    index = (rows * width + cols).reshape(n, 1, height * width).expand(n, channels, height * width)
    out = x.reshape(n, channels, height * width).gather(2, index).view(n, channels, height, width)
    if inside is not None:
        out = torch.where(inside.unsqueeze(1), out, torch.zeros((), dtype=x.dtype, device=x.device))
    return same_memory_format(out, x)


def same_memory_format(out: Tensor, like: Tensor) -> Tensor:
    """``out`` channels-last when ``like`` is (the networks after it are then fed what they were given)."""
    if like.dim() == 4 and not like.is_contiguous() and like.is_contiguous(memory_format=torch.channels_last):
        return out.contiguous(memory_format=torch.channels_last)
    return out
