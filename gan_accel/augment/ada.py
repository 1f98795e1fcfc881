"""ADA's augmentation pipeline (Karras et al., 2020) with one probability ``p`` for every transform.

Each transform applies to each sample independently with probability ``p``; distributions as the
paper's appendix B: **blit** (x-flip, quarter turns, integer translation: one exact gather),
**color** (brightness, contrast, luma flip, hue, saturation: one affine colour map) and, opt-in,
**geometric** (one bilinear ``grid_sample``: ADA's anti-aliasing wavelet filter is not implemented, so
it is off by default). ``p = 0`` returns the input itself; otherwise the draws per call are fixed in
number and order, from torch's global generator on ``x``'s device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .base import check_probability, keep_unselected
from .color import apply_color, color_transform
from .pixels import flip_x, gather_pixels, identity_coordinates, reflect, rotate90, same_memory_format, translate

LN2 = math.log(2)


@dataclass
class AdaDraws:
    """One call's random values, per sample: what :meth:`AdaAugment.apply` needs to repeat the call."""

    flip: Tensor  # (N,) bool
    quarter_turns: Tensor  # (N,) int64 in 0..3
    shift: Tensor  # (N, 2) int64 pixels (down, right)
    geometry: Tensor | None  # (N, 2, 3) affine_grid matrices, or None (geometric off)
    geometry_selected: Tensor | None  # (N,) bool: a geometric transform was drawn
    color: tuple[Tensor, Tensor] | None  # (A (N, 3, 3), t (N, 3)), or None (colour off)
    color_selected: Tensor | None  # (N,) bool: a colour transform was drawn


class AdaAugment(nn.Module):
    """``AdaAugment(p)(x)``: ADA's blit, colour and (opt-in) geometric transforms; differentiable w.r.t. x."""

    def __init__(self, p: float = 0.0, blit: bool = True, color: bool = True, geometric: bool = False) -> None:
        super().__init__()
        self.p = check_probability(p)
        self.blit, self.color, self.geometric = blit, color, geometric

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0:
            return x
        return self.apply(x, self.draw(x.shape[0], x.shape[2], x.shape[3], x.device))

    # -- the draws ------------------------------------------------------------------------------------
    def draw(self, n: int, height: int, width: int, device: torch.device) -> AdaDraws:
        """The random values of one call at the current ``p``."""
        p = self.p

        def coin(q: float = p) -> Tensor:
            return torch.rand(n, device=device) < q

        flip = coin() & coin(0.5)
        quarter_turns = torch.where(coin(), torch.randint(0, 4, (n,), device=device), 0)
        side = torch.tensor([height, width], device=device)
        steps = torch.round((torch.rand(n, 2, device=device) * 2 - 1) * 0.125 * side).long()
        shift = torch.where(coin().view(n, 1), steps, 0)
        geometry, selected_g = _draw_geometry(n, p, device) if self.geometric else (None, None)
        color, selected_c = _draw_color(n, p, device) if self.color else (None, None)
        return AdaDraws(flip, quarter_turns, shift, geometry, selected_g, color, selected_c)

    # -- applying them ----------------------------------------------------------------------------------
    def apply(self, x: Tensor, draws: AdaDraws) -> Tensor:
        """The pipeline with given draws (the same call as ``forward`` made, when drawn with the same RNG state)."""
        n, _, height, width = x.shape
        if self.blit:
            if height != width:
                raise ValueError(f"ADA's quarter turns need square images, got {height}x{width}: use blit=False")
            rows, cols = identity_coordinates(n, height, width, x.device)
            rows, cols = translate(rows, cols, draws.shift)
            rows, cols = reflect(rows, height), reflect(cols, width)
            rows, cols = rotate90(rows, cols, draws.quarter_turns, height)
            rows, cols = flip_x(rows, cols, draws.flip, width)
            x = gather_pixels(x, rows, cols)
        if draws.geometry is not None:
            grid = F.affine_grid(draws.geometry.to(x.dtype), list(x.shape), align_corners=False)
            moved = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
            x = keep_unselected(draws.geometry_selected, same_memory_format(moved, x), x)
        if draws.color is not None:
            x = keep_unselected(draws.color_selected, same_memory_format(apply_color(x, *draws.color), x), x)
        return x

    def extra_repr(self) -> str:
        return f"p={self.p:g}, blit={self.blit}, color={self.color}, geometric={self.geometric}"


def _draw_color(n: int, p: float, device: torch.device) -> tuple[tuple[Tensor, Tensor], Tensor]:
    coins = torch.rand(5, n, device=device) < p  # brightness, contrast, luma flip, hue, saturation
    brightness = torch.where(coins[0], torch.randn(n, device=device) * 0.2, 0.0)
    contrast = torch.where(coins[1], torch.exp2(torch.randn(n, device=device) * 0.5), 1.0)
    flip = coins[2] & (torch.rand(n, device=device) < 0.5)
    hue = torch.where(coins[3], (torch.rand(n, device=device) * 2 - 1) * math.pi, 0.0)
    saturation = torch.where(coins[4], torch.exp2(torch.randn(n, device=device)), 1.0)
    return color_transform(brightness, contrast, flip, hue, saturation), coins.any(dim=0)


def _draw_geometry(n: int, p: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """affine_grid matrices (output -> input, normalised coordinates) and which samples drew any transform.

    The distributions are symmetric (a scale and its inverse, an angle and its negative, a shift and its
    negative are equally likely), so the drawn chain serves as its own inverse's draw."""
    p_rotate = 1 - math.sqrt(max(1 - p, 0.0))  # two rotations: any rotation with probability p
    coins = torch.stack([torch.rand(n, device=device) < q for q in (p, p_rotate, p, p_rotate, p)])

    def scale(sx: Tensor, sy: Tensor) -> Tensor:
        return torch.diag_embed(torch.stack([sx, sy, torch.ones_like(sx)], dim=1))

    def rotation(theta: Tensor) -> Tensor:
        c, s = theta.cos(), theta.sin()
        z, o = torch.zeros_like(c), torch.ones_like(c)
        return torch.stack([c, -s, z, s, c, z, z, z, o], dim=1).view(n, 3, 3)

    iso = torch.where(coins[0], torch.exp2(torch.randn(n, device=device) * 0.2), 1.0)
    pre = torch.where(coins[1], (torch.rand(n, device=device) * 2 - 1) * math.pi, 0.0)
    aniso = torch.where(coins[2], torch.exp2(torch.randn(n, device=device) * 0.2), 1.0)
    post = torch.where(coins[3], (torch.rand(n, device=device) * 2 - 1) * math.pi, 0.0)
    shift = torch.where(coins[4].view(n, 1), torch.randn(n, 2, device=device) * 0.125 * 2, 0.0)  # [-1, 1] spans 2
    move = torch.eye(3, device=device).repeat(n, 1, 1)
    move[:, :2, 2] = shift
    m = move @ rotation(post) @ scale(aniso, 1 / aniso) @ rotation(pre) @ scale(iso, iso)
    return m[:, :2, :], coins.any(dim=0)
