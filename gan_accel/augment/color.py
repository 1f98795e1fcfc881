"""ADA's colour transforms (Karras et al., 2020, appendix B) as one affine map of each pixel's colour.

A sample's chain (brightness, contrast, luma flip, hue rotation, saturation) is composed into one 3x3
matrix ``A`` and offset ``t``, applied in one pass: ``x' = A x + t`` (luma axis ``(1, 1, 1) / sqrt(3)``).
A one-channel image is treated as grey ``(x, x, x)`` and averaged back: hue and saturation leave it alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _luma(device: torch.device) -> Tensor:
    return torch.full((3,), 1 / math.sqrt(3), device=device)


def color_transform(brightness: Tensor, contrast: Tensor, flip: Tensor, hue: Tensor,
                    saturation: Tensor) -> tuple[Tensor, Tensor]:
    """(A (N, 3, 3), t (N, 3)) of the chain with the given per-sample values (each (N,), float32)."""
    n, device = brightness.shape[0], brightness.device
    eye = torch.eye(3, device=device).expand(n, 3, 3)
    v = _luma(device)
    vvT = torch.outer(v, v).expand(n, 3, 3)
    cross = torch.tensor([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]], device=device)
    per = lambda values: values.view(n, 1, 1)  # noqa: E731
    contrast_m = eye * per(contrast)
    flip_m = eye - 2 * vvT * per(flip.to(eye.dtype))
    # Rodrigues: rotation by theta about the unit axis v
    rotation = eye * per(hue.cos()) + cross * per(hue.sin()) + vvT * per(1 - hue.cos())
    saturation_m = vvT + (eye - vvT) * per(saturation)
    a = saturation_m @ rotation @ flip_m @ contrast_m
    t = a @ (brightness.view(n, 1).expand(n, 3).unsqueeze(2))  # the brightness offset through the rest
    return a, t.squeeze(2)


def apply_color(x: Tensor, a: Tensor, t: Tensor) -> Tensor:
    """``A x + t`` per pixel, for 3-channel images; the grey rule (module docstring) for 1-channel ones."""
    channels = x.shape[1]
    a, t = a.to(x.dtype), t.to(x.dtype)
    if channels == 3:
        return torch.einsum("nij,njhw->nihw", a, x) + t.view(-1, 3, 1, 1)
    if channels == 1:
        gain = a.sum(dim=2).mean(dim=1)  # mean over rows of A (1, 1, 1)
        return x * gain.view(-1, 1, 1, 1) + t.mean(dim=1).view(-1, 1, 1, 1)
    raise ValueError(f"ADA's colour transforms take 1- or 3-channel images, got {channels} channels: "
                     "turn them off (color=False)")
