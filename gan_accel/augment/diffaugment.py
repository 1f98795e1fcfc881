"""DiffAugment (Zhao et al., 2020): colour, translation and cutout, applied to every image D sees.

From the paper: ``color`` (brightness U(-0.5, 0.5), saturation U(0, 2), contrast U(0.5, 1.5), one draw per
sample), ``translation`` (integer shifts up to ``translation_ratio`` of the side, zero fill) and ``cutout``
(a zeroed square of ``cutout_ratio`` of the side). ``p`` (default 1) is each item's probability per sample;
``p = 0`` returns the input itself. Draws come from torch's global generator, fixed in order and number.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .base import check_probability, coin_flips, keep_unselected
from .pixels import gather_pixels, identity_coordinates, translate

POLICY_ITEMS = ("color", "translation", "cutout")


def brightness_saturation_contrast(x: Tensor, brightness: Tensor, saturation: Tensor, contrast: Tensor) -> Tensor:
    """DiffAugment's colour transform with given per-sample factors, each of shape (N,)."""
    view = (-1, 1, 1, 1)
    x = x + brightness.to(x.dtype).view(view)
    mean = x.mean(dim=1, keepdim=True)
    x = (x - mean) * saturation.to(x.dtype).view(view) + mean
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * contrast.to(x.dtype).view(view) + mean


def shift_with_zeros(x: Tensor, shift: Tensor) -> Tensor:
    """Each sample moved by ``shift[n] = (dy, dx)`` pixels (down, right), zeros where nothing moved in."""
    n, _, height, width = x.shape
    rows, cols = translate(*identity_coordinates(n, height, width, x.device), shift)
    return gather_pixels(x, rows, cols, fill_outside=True)


def cut_out(x: Tensor, centre: Tensor, side: int) -> Tensor:
    """Each sample with a ``side`` x ``side`` square of zeros whose top-left pixel is ``centre - side // 2``
    (``centre`` (N, 2) as (row, col)), clipped at the image's borders."""
    _, _, height, width = x.shape
    top, left = (centre[:, 0] - side // 2).view(-1, 1, 1, 1), (centre[:, 1] - side // 2).view(-1, 1, 1, 1)
    rows = torch.arange(height, device=x.device).view(1, 1, height, 1)
    cols = torch.arange(width, device=x.device).view(1, 1, 1, width)
    inside = (rows >= top) & (rows < top + side) & (cols >= left) & (cols < left + side)
    return torch.where(inside, torch.zeros((), dtype=x.dtype, device=x.device), x)


class DiffAugment(nn.Module):
    """``DiffAugment(policy="color,translation,cutout")(x)``: differentiable w.r.t. ``x``, no parameters."""

    def __init__(self, policy: str = "color,translation,cutout", p: float = 1.0, translation_ratio: float = 0.125,
                 cutout_ratio: float = 0.5) -> None:
        super().__init__()
        self.policy = tuple(item.strip() for item in policy.split(",") if item.strip())
        unknown = [item for item in self.policy if item not in POLICY_ITEMS]
        if unknown or not self.policy:
            raise ValueError(f"DiffAugment policy {policy!r}: use a comma-separated list of {', '.join(POLICY_ITEMS)}")
        self.p = check_probability(p)
        self.translation_ratio = check_probability(translation_ratio, "translation_ratio")
        self.cutout_ratio = check_probability(cutout_ratio, "cutout_ratio")

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0:
            return x
        for item in self.policy:
            selected = coin_flips(x.shape[0], self.p, x.device)
            x = keep_unselected(selected, getattr(self, f"_{item}")(x), x)
        return x

    def _color(self, x: Tensor) -> Tensor:
        n, device = x.shape[0], x.device
        brightness = torch.rand(n, device=device) - 0.5
        saturation = torch.rand(n, device=device) * 2
        contrast = torch.rand(n, device=device) + 0.5
        return brightness_saturation_contrast(x, brightness, saturation, contrast)

    def _translation(self, x: Tensor) -> Tensor:
        n, (height, width) = x.shape[0], x.shape[2:]
        reach_y, reach_x = int(height * self.translation_ratio + 0.5), int(width * self.translation_ratio + 0.5)
        shift = torch.stack([torch.randint(-reach_y, reach_y + 1, (n,), device=x.device),
                             torch.randint(-reach_x, reach_x + 1, (n,), device=x.device)], dim=1)
        return shift_with_zeros(x, shift)

    def _cutout(self, x: Tensor) -> Tensor:
        n, (height, width) = x.shape[0], x.shape[2:]
        side = int(min(height, width) * self.cutout_ratio + 0.5)
        centre = torch.stack([torch.randint(0, height, (n,), device=x.device),
                              torch.randint(0, width, (n,), device=x.device)], dim=1)
        return cut_out(x, centre, side)

    def extra_repr(self) -> str:
        return f"policy={','.join(self.policy)!r}, p={self.p}"
