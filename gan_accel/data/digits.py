"""Synthetic data, no network: MNIST-like digits rendered from Pillow's bundled font, and Gaussian modes on a
ring or a grid (the classic mode-collapse benchmarks of GAN papers)."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor


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


def _inverse_affines(angle: Tensor, scale: Tensor, aspect: Tensor, shear: Tensor, shift: Tensor) -> Tensor:
    """(n, 2, 3) output->template maps for ``grid_sample``.

    The forward map template -> output is A = R(angle) @ Shear @ diag(scale * aspect, scale), plus
    shift; sampling wants the inverse (output coordinates -> where to read in the template).
    """
    n = angle.shape[0]
    cos, sin = angle.cos(), angle.sin()
    rot = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)
    shear_m = torch.zeros(n, 2, 2)
    shear_m[:, 0, 0] = shear_m[:, 1, 1] = 1
    shear_m[:, 0, 1] = shear
    forward = rot @ shear_m @ torch.diag_embed(torch.stack([scale * aspect, scale], -1))
    inverse = torch.linalg.inv(forward)
    return torch.cat([inverse, -(inverse @ shift.unsqueeze(-1))], dim=-1)


def _warp(templates: Tensor, theta: Tensor, template_idx: Tensor, base: Tensor, size: int) -> Tensor:
    """Each sample's template warped by its ``theta`` at 2x resolution, then average-pooled to ``size``."""
    hi = 2 * size
    x = torch.empty(theta.shape[0], 1, size, size)
    for t in template_idx.unique().tolist():
        sel = (template_idx == t).nonzero().squeeze(1)
        k = sel.numel()
        # One (2k, 3) @ (3, hi*hi) matmul: far faster on CPU than affine_grid's batched K=3 matmul.
        grid = (theta[sel].reshape(2 * k, 3) @ base.T).view(k, 2, hi, hi).permute(0, 2, 3, 1)
        grid = grid.reshape(1, k * hi, hi, 2)
        # All k samples of one template in a single call: their grids are stacked along the height
        # axis, so the template is read in place instead of being copied once per sample.
        warped = F.grid_sample(templates[t : t + 1], grid, mode="bilinear", align_corners=False)
        x[sel] = F.avg_pool2d(warped.view(k, 1, hi, hi), 2)
    return x


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

    theta = _inverse_affines(angle, scale, aspect, shear, shift)

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
        x = _warp(templates, theta[start:stop], template_idx[start:stop], base, size)
        x = _random_blur(x, blur_mix[start:stop])
        # Multiplicative noise only touches ink, so the background stays exactly 0 like MNIST.
        x = x * (1 + 0.05 * torch.randn(x.shape, generator=g))
        peak = x.amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)
        x = (x / peak * contrast[start:stop].view(b, 1, 1, 1)).clamp_(0, 1)
        # MNIST's background is exactly 0; without this the bilinear/blur halo would tint a third of it.
        x = x.masked_fill_(x < 8 / 255, 0)
        out[start:stop] = x.mul_(255).round_().to(torch.uint8)
    return out, labels


def ring_centres(modes: int = 8, radius: float = 1.0) -> Tensor:
    """The ``modes`` centres, evenly spaced on a circle of ``radius``, as (modes, 2) float32."""
    angles = torch.arange(modes, dtype=torch.float64) * (2 * math.pi / modes)
    return (torch.stack([angles.cos(), angles.sin()], 1) * radius).float()


def grid_centres(side: int = 5, spacing: float = 2.0) -> Tensor:
    """``side**2`` centres on a square grid centred at 0 (5 x 5 at spacing 2: {-4, -2, 0, 2, 4}^2), (side**2, 2)."""
    axis = (torch.arange(side, dtype=torch.float64) - (side - 1) / 2) * spacing
    return torch.cartesian_prod(axis, axis).float()


# PacGAN's (and VEEGAN's) 2-D benchmarks: (centres, std) of the ring of 8 and the grid of 25.
TOY_MIXTURES = {"ring": (ring_centres(), 0.01), "grid": (grid_centres(), 0.05)}


def gaussian_mixture(n: int, centres: Tensor, std: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n`` points (n, 2) float32 drawn evenly from isotropic Gaussians of ``std`` at ``centres``, and each
    point's mode index (n,) int64. Deterministic for a seed."""
    generator = torch.Generator().manual_seed(seed)
    mode = torch.randint(0, len(centres), (n,), generator=generator)
    points = centres[mode] + std * torch.randn(n, centres.shape[1], generator=generator)
    return points, mode
