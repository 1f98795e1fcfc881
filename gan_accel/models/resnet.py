"""Residual G and D in the SNGAN / BigGAN line (Miyato et al. 2018; Brock et al. 2019) for 28 to 256 px.

G: a linear map of z to a ``base x base`` grid, one up-sampling residual block per doubling, then
BN-ReLU-conv3x3-tanh; conditional G uses class-conditional BatchNorm (de Vries et al. 2017). D: one
down-sampling block per halving, one more at ``base``, ReLU, a sum over space and a linear logit, spectral
normalisation on every weight; conditional D: the projection head, ``all_classes=True`` giving (N, K).
Widths follow :data:`CHANNELS` (halving as the side doubles, capped at 16x; D at half G's).

No in-place activation (a DDP-wrapped network may run twice before one backward); every op has a double
backward (R1) and keeps channels-last tensors channels-last.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .spectral import SNConv2d, SNEmbedding, SNLinear, install_spectral_refresh, reset_spectral_norm

# Width multiplier of G at each scale, from the ``base`` grid to the image (one block per step).
CHANNELS: dict[int, tuple[int, ...]] = {
    28: (4, 2, 1),  # 7, 14, 28
    32: (4, 4, 2, 1),  # 4 .. 32
    64: (8, 8, 4, 2, 1),
    128: (16, 16, 8, 4, 2, 1),  # BigGAN 128 px
    256: (16, 16, 8, 8, 4, 2, 1),  # BigGAN 256 px
}
SUPPORTED_SIZES = tuple(CHANNELS)
NORMS = ("batch", "none")


def base_size(image_size: int) -> int:
    """The side of the smallest grid (G's first, D's last)."""
    if image_size not in CHANNELS:
        sizes = ", ".join(map(str, SUPPORTED_SIZES))
        raise ValueError(f"image_size={image_size} is not supported by the residual models: choose one of {sizes}")
    return image_size >> (len(CHANNELS[image_size]) - 1)


def _init(module: nn.Module) -> None:
    """Glorot-uniform weights and zero biases (as SNGAN); conditional gains start at 1, biases at 0."""
    if isinstance(module, (nn.Conv2d, nn.Linear)):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.xavier_uniform_(module.weight)


class Norm(nn.Module):
    """BatchNorm (``"batch"``) or nothing (``"none"``: each sample's output depends on it alone, so the
    accumulation proofs hold exactly), then a gain and a bias, per channel or looked up from the class."""

    def __init__(self, channels: int, num_classes: int | None = None, norm: str = "batch") -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm={norm!r} is not supported: choose one of {', '.join(NORMS)}")
        self.bn = nn.BatchNorm2d(channels, affine=False) if norm == "batch" else nn.Identity()
        self.conditional = num_classes is not None
        if self.conditional:
            self.gain, self.bias = nn.Embedding(num_classes, channels), nn.Embedding(num_classes, channels)
        else:
            self.gain, self.bias = nn.Parameter(torch.ones(channels)), nn.Parameter(torch.zeros(channels))

    def reset_affine(self) -> None:
        if self.conditional:
            nn.init.ones_(self.gain.weight)
            nn.init.zeros_(self.bias.weight)

    def forward(self, x: Tensor, y: Tensor | None) -> Tensor:
        h = self.bn(x)
        if self.conditional:
            return h * self.gain(y)[:, :, None, None] + self.bias(y)[:, :, None, None]
        return h * self.gain[:, None, None] + self.bias[:, None, None]


class UpBlock(nn.Module):
    """``BN-ReLU-up-conv3x3-BN-ReLU-conv3x3`` + ``up(conv1x1(x))``, doubling the side."""

    def __init__(self, c_in: int, c_out: int, num_classes: int | None, norm: str) -> None:
        super().__init__()
        self.norm1, self.conv1 = Norm(c_in, num_classes, norm), nn.Conv2d(c_in, c_out, 3, 1, 1)
        self.norm2, self.conv2 = Norm(c_out, num_classes, norm), nn.Conv2d(c_out, c_out, 3, 1, 1)
        self.skip = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x: Tensor, y: Tensor | None) -> Tensor:
        h = F.interpolate(F.relu(self.norm1(x, y)), scale_factor=2, mode="nearest")
        h = self.conv2(F.relu(self.norm2(self.conv1(h), y)))
        # 1x1 conv then nearest up-sampling: the same map as the other order (both act per pixel), 4x cheaper
        return h + F.interpolate(self.skip(x), scale_factor=2, mode="nearest")


class DownBlock(nn.Module):
    """``ReLU-conv3x3-ReLU-conv3x3-pool`` + ``conv1x1(pool(x))``; the first block takes the image as it is."""

    def __init__(self, c_in: int, c_out: int, down: bool, first: bool) -> None:
        super().__init__()
        self.down, self.first = down, first
        self.conv1, self.conv2 = SNConv2d(c_in, c_out, 3, 1, 1), SNConv2d(c_out, c_out, 3, 1, 1)
        self.skip = SNConv2d(c_in, c_out, 1) if (down or c_in != c_out) else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv2(F.relu(self.conv1(x if self.first else F.relu(x))))
        s = x
        if self.down:
            h, s = F.avg_pool2d(h, 2), F.avg_pool2d(x, 2)  # pooling before the 1x1 conv: same map, 4x cheaper
        return h + (self.skip(s) if self.skip is not None else s)


class ResNetGenerator(nn.Module):
    """``G(z)``, or ``G(z, y)`` with ``num_classes``: latent (N, z_dim) -> images (N, channels, S, S) in [-1, 1]."""

    def __init__(self, z_dim: int = 128, width: int = 64, image_size: int = 32, channels: int = 3,
                 num_classes: int | None = None, norm: str = "batch") -> None:
        super().__init__()
        self.z_dim, self.width, self.image_size, self.channels = z_dim, width, image_size, channels
        self.num_classes, self.norm = num_classes, norm
        self.base = base_size(image_size)
        widths = [width * m for m in CHANNELS[image_size]]
        self.linear = nn.Linear(z_dim, widths[0] * self.base ** 2)
        self.blocks = nn.ModuleList(UpBlock(a, b, num_classes, norm) for a, b in zip(widths[:-1], widths[1:]))
        self.out_norm = Norm(widths[-1], None, norm)  # unconditional, as in BigGAN
        self.out_conv = nn.Conv2d(widths[-1], channels, 3, 1, 1)
        self.apply(_init)
        for module in self.modules():
            if isinstance(module, Norm):
                module.reset_affine()

    def forward(self, z: Tensor, y: Tensor | None = None) -> Tensor:
        _check_labels(self, y)
        h = self.linear(z.reshape(z.shape[0], -1)).view(z.shape[0], -1, self.base, self.base)
        for block in self.blocks:
            h = block(h, y)
        return torch.tanh(self.out_conv(F.relu(self.out_norm(h, None))))


class ResNetDiscriminator(nn.Module):
    """``D(x)``, or with ``num_classes`` the projection ``D(x, y)`` / ``D(x, y, all_classes=True)``: raw logits."""

    def __init__(self, width: int = 64, image_size: int = 32, channels: int = 3,
                 num_classes: int | None = None) -> None:
        super().__init__()
        self.width, self.image_size, self.channels, self.num_classes = width, image_size, channels, num_classes
        self.base = base_size(image_size)
        widths = [width * m for m in reversed(CHANNELS[image_size])]  # after each block: S/2, ..., base, base
        self.blocks = nn.Sequential(*(DownBlock(c_in, c_out, down=index < len(widths) - 1, first=index == 0)
                                      for index, (c_in, c_out) in enumerate(zip([channels, *widths], widths))))
        self.feature_dim = c = widths[-1]
        self.psi = SNLinear(c, 1)
        self.embed = SNEmbedding(num_classes, c) if num_classes is not None else None
        self.apply(_init)
        reset_spectral_norm(self)  # u, v of the initialised weights
        install_spectral_refresh(self)

    def features(self, x: Tensor) -> Tensor:
        """h: (N, feature_dim), ReLU then a sum over space of the last block's output."""
        return F.relu(self.blocks(x)).sum(dim=(2, 3))

    def forward(self, x: Tensor, y: Tensor | None = None, all_classes: bool = False) -> Tensor:
        """One logit per sample; with ``all_classes=True`` (conditional only) the (N, num_classes) logits
        of every class, whose column ``y`` is the plain logit (a class loss uses it)."""
        _check_labels(self, y)
        h = self.features(x)
        out = self.psi(h)  # (N, 1)
        if self.embed is None:
            return out.reshape(x.shape[0])
        if all_classes:
            return out + h @ self.embed.normalized_weight().t()
        return out.reshape(x.shape[0]) + (self.embed(y) * h).sum(dim=1)


def _check_labels(net: nn.Module, y: Tensor | None) -> None:
    if net.num_classes is not None and y is None:
        raise TypeError(f"{type(net).__name__} was built with num_classes={net.num_classes}: call it with labels y")
    if net.num_classes is None and y is not None:
        raise TypeError(f"{type(net).__name__} is unconditional (num_classes=None): call it without labels, "
                        "or build it with num_classes")
