"""R3GAN's ConvNet (Huang et al., "The GAN is dead; long live the GAN! A Modern GAN Baseline", 2024), 28 to 256 px.

A residual network without normalisation: ResNeXt inverted bottleneck blocks (1x1 widen by
:data:`EXPANSION`, grouped 3x3, 1x1), leaky ReLU. Fix-up initialisation: each block's last conv starts at
zero, the others are He-initialised and scaled by ``L ** -1/4``, which bounds the variance the blocks add.
G: a learned basis scaled per channel by a linear map of z, blocks and bilinear up-sampling, no tanh. D
mirrors it (average pooling, a depthwise conv over the final grid, a linear logit); conditional D is a
projection, ``all_classes=True`` giving (N, K). Standard ops only, none in place: channels-last,
``torch.compile``, bf16 and a double backward (R1, R2) apply.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .resnet import CHANNELS, SUPPORTED_SIZES, _check_labels, base_size

EXPANSION = 2  # the inverted bottleneck's widening
GROUP_WIDTH = 16  # channels per group of the 3x3 conv (fewer when the width does not divide)
LEAK = 0.2
ACT_GAIN = math.sqrt(2 / (1 + LEAK ** 2))  # He's gain for a leaky ReLU


def _he(layer: nn.Module, gain: float = 1.0) -> nn.Module:
    """Weights ~ N(0, gain^2 / fan_in), biases at zero."""
    nn.init.normal_(layer.weight, 0.0, gain / math.sqrt(layer.weight[0].numel()))
    if getattr(layer, "bias", None) is not None:
        nn.init.zeros_(layer.bias)
    return layer


class Block(nn.Module):
    """``x + project(act(mix(act(expand(x)))))``, ``project`` at zero: the identity at initialisation."""

    def __init__(self, channels: int, total_blocks: int) -> None:
        super().__init__()
        wide = channels * EXPANSION
        gain = ACT_GAIN * total_blocks ** -0.25
        self.expand = _he(nn.Conv2d(channels, wide, 1), gain)
        self.mix = _he(nn.Conv2d(wide, wide, 3, 1, 1, groups=wide // math.gcd(wide, GROUP_WIDTH)), gain)
        self.project = nn.Conv2d(wide, channels, 1, bias=False)
        nn.init.zeros_(self.project.weight)

    def forward(self, x: Tensor) -> Tensor:
        h = F.leaky_relu(self.mix(F.leaky_relu(self.expand(x), LEAK)), LEAK)
        return x + self.project(h)


def _conv1x1(c_in: int, c_out: int) -> nn.Module:
    return _he(nn.Conv2d(c_in, c_out, 1, bias=False)) if c_in != c_out else nn.Identity()


class R3GANGenerator(nn.Module):
    """``G(z)``, or ``G(z, y)`` with ``num_classes``: latent (N, z_dim) -> images (N, channels, S, S)."""

    def __init__(self, z_dim: int = 64, width: int = 64, image_size: int = 32, channels: int = 3,
                 num_classes: int | None = None, blocks: int = 2) -> None:
        super().__init__()
        self.z_dim, self.width, self.image_size, self.channels = z_dim, width, image_size, channels
        self.num_classes, self.base = num_classes, base_size(image_size)
        widths = [width * m for m in CHANNELS[image_size]]
        self.embed = nn.Embedding(num_classes, z_dim) if num_classes is not None else None
        if self.embed is not None:
            nn.init.normal_(self.embed.weight)  # on the latent's scale
        self.basis = nn.Parameter(torch.randn(widths[0], self.base, self.base))
        self.modulation = _he(nn.Linear(z_dim * (1 + (num_classes is not None)), widths[0], bias=False))
        total = blocks * len(widths)
        self.stages = nn.ModuleList(nn.Sequential(*(Block(c, total) for _ in range(blocks))) for c in widths)
        self.transitions = nn.ModuleList(_conv1x1(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.to_image = _he(nn.Conv2d(widths[-1], channels, 1, bias=False))

    def forward(self, z: Tensor, y: Tensor | None = None) -> Tensor:
        _check_labels(self, y)
        z = z.reshape(z.shape[0], -1)
        if self.embed is not None:
            z = torch.cat([z, self.embed(y)], dim=1)
        h = self.basis[None] * self.modulation(z)[:, :, None, None]
        for index, stage in enumerate(self.stages):
            h = stage(h)
            if index < len(self.transitions):  # 1x1 conv before up-sampling: the same map, 4x cheaper
                h = F.interpolate(self.transitions[index](h), scale_factor=2, mode="bilinear", align_corners=False)
        return self.to_image(h)


class R3GANDiscriminator(nn.Module):
    """``D(x)``, or with ``num_classes`` the projection ``D(x, y)`` / ``D(x, y, all_classes=True)``: raw logits."""

    def __init__(self, width: int = 64, image_size: int = 32, channels: int = 3, num_classes: int | None = None,
                 blocks: int = 2) -> None:
        super().__init__()
        self.width, self.image_size, self.channels, self.num_classes = width, image_size, channels, num_classes
        self.base = base_size(image_size)
        widths = [width * m for m in reversed(CHANNELS[image_size])]  # the image's scale first
        total = blocks * len(widths)
        self.from_image = _he(nn.Conv2d(channels, widths[0], 1, bias=False))
        self.stages = nn.ModuleList(nn.Sequential(*(Block(c, total) for _ in range(blocks))) for c in widths)
        self.transitions = nn.ModuleList(_conv1x1(a, b) for a, b in zip(widths[:-1], widths[1:]))
        c = self.feature_dim = widths[-1]
        self.basis = _he(nn.Conv2d(c, c, self.base, groups=c, bias=False))  # one feature per channel
        self.head = _he(nn.Linear(c, 1 if num_classes is None else c, bias=False))
        self.embed = nn.Embedding(num_classes, c) if num_classes is not None else None
        if self.embed is not None:
            nn.init.normal_(self.embed.weight, 0.0, c ** -0.5)

    def forward(self, x: Tensor, y: Tensor | None = None, all_classes: bool = False) -> Tensor:
        """One logit per sample; with ``all_classes=True`` (conditional only) the (N, num_classes) logits
        of every class, whose column ``y`` is the plain logit (a class loss uses it)."""
        _check_labels(self, y)
        h = self.from_image(x)
        for index, stage in enumerate(self.stages):
            h = stage(h)
            if index < len(self.transitions):  # pooling before the 1x1 conv: the same map, 4x cheaper
                h = self.transitions[index](F.avg_pool2d(h, 2))
        out = self.head(self.basis(h).flatten(1))
        if self.embed is None:
            return out.reshape(x.shape[0])
        if all_classes:
            return out @ self.embed.weight.t()
        return (out * self.embed(y)).sum(dim=1)
