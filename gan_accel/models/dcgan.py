"""DCGAN (Radford et al., 2016) for 28x28, 32x32 and 64x64 images.

G: latent (N, z_dim) -> images (N, C, S, S) in [-1, 1] (tanh). D: images -> one logit per image
(no sigmoid: the losses take logits). Width is the channel count of G's last hidden layer and D's
first; each layer doubles it towards the 4x4 (or 7x7 for 28x28) bottleneck.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm as _spectral_norm

SUPPORTED_SIZES = (28, 32, 64)
# How D sees where things are besides its convs: coordinate channels, a quadratic read of each channel's centre
# of mass, or that and a small network on the image's row and column ink profiles (its extent and placement).
POSITIONS = ("coords", "moments", "profiles", "none")


def _plan(image_size: int) -> tuple[int, int]:
    """(bottleneck spatial size, number of 2x up/down-sampling stages) for an image size."""
    if image_size not in SUPPORTED_SIZES:
        raise ValueError(f"image_size={image_size} is not supported: choose one of {SUPPORTED_SIZES}")
    return {28: (7, 2), 32: (4, 3), 64: (4, 4)}[image_size]


def dcgan_init(module: nn.Module) -> None:
    """DCGAN initialisation: conv weights N(0, 0.02), BatchNorm weights N(1, 0.02) and zero bias."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def generator_stack(in_channels: int, width: int, image_size: int, channels: int) -> nn.Sequential:
    """(N, in_channels, 1, 1) -> (N, channels, S, S) in [-1, 1]: transposed convs with BatchNorm and ReLU."""
    base, stages = _plan(image_size)
    top = width * 2 ** (stages - 1)
    layers: list[nn.Module] = [
        nn.ConvTranspose2d(in_channels, top, base, 1, 0, bias=False),  # -> (N, top, base, base)
        nn.BatchNorm2d(top),
        nn.ReLU(True),
    ]
    ch = top
    for _ in range(stages - 1):
        layers += [nn.ConvTranspose2d(ch, ch // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch // 2), nn.ReLU(True)]
        ch //= 2
    layers += [nn.ConvTranspose2d(ch, channels, 4, 2, 1), nn.Tanh()]
    return nn.Sequential(*layers)


def discriminator_stack(in_channels: int, width: int, stages: int, spectral_norm: bool,
                        first_bias: bool = True) -> tuple[list[nn.Module], int]:
    """(strided convs halving the side ``stages`` times with LeakyReLU(0.2), BatchNorm after all but the first
    unless ``spectral_norm`` (which replaces it, as in the paper), their last width)."""
    layers: list[nn.Module] = [nn.Conv2d(in_channels, width, 4, 2, 1, bias=first_bias), nn.LeakyReLU(0.2, True)]
    ch = width
    for _ in range(stages - 1):
        layers.append(nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=spectral_norm))
        if not spectral_norm:
            layers.append(nn.BatchNorm2d(ch * 2))
        layers.append(nn.LeakyReLU(0.2, True))
        ch *= 2
    return layers, ch


class DCGANGenerator(nn.Module):
    """Transposed-conv generator with BatchNorm and ReLU, tanh output."""

    def __init__(self, z_dim: int = 100, width: int = 64, image_size: int = 28, channels: int = 1) -> None:
        super().__init__()
        self.z_dim, self.image_size, self.channels = z_dim, image_size, channels
        self.net = generator_stack(z_dim, width, image_size, channels)
        self.apply(dcgan_init)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z.reshape(z.shape[0], -1, 1, 1))


class DCGANDiscriminator(nn.Module):
    """Strided-conv discriminator with LeakyReLU(0.2), BatchNorm after the first layer, one logit out;
    ``spectral_norm=True``: spectral normalisation on every conv instead of BatchNorm; ``position``: how D
    sees where the content sits besides its convs (:data:`POSITIONS`; None: not at all)."""

    def __init__(self, width: int = 64, image_size: int = 28, channels: int = 1, spectral_norm: bool = False,
                 position: str | None = None) -> None:
        super().__init__()
        base, stages = _plan(image_size)
        self.image_size, self.channels, self.position = image_size, channels, position
        if position not in (None, *POSITIONS):
            raise ValueError(f"position={position!r}: choose one of {', '.join(POSITIONS)}")
        layers, ch = discriminator_stack(channels + 2 * (position == "coords"), width, stages, spectral_norm,
                                         first_bias=spectral_norm)
        self.net = nn.Sequential(*layers, nn.Conv2d(ch, 1, base, 1, 0))  # (N, ch, base, base) -> (N, 1, 1, 1)
        self.moments = nn.Linear(MOMENTS * channels, 1, bias=False) if position in ("moments", "profiles") else None
        self.profiles = nn.Sequential(nn.Linear(2 * image_size * channels, 4 * width), nn.LeakyReLU(0.2, True),
                                      nn.Linear(4 * width, 1)) if position == "profiles" else None
        self.apply(dcgan_init)
        if spectral_norm:  # after the initialisation: it then normalises the initial weights
            for module in self.net:
                if isinstance(module, nn.Conv2d):
                    _spectral_norm(module)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.cat([x, coordinate_grid(x).expand(len(x), -1, -1, -1)], dim=1) if self.position == "coords" else x
        out = self.net(h).reshape(x.shape[0])
        if self.moments is not None:
            out = out + self.moments(image_moments(x)).reshape(x.shape[0])
        if self.profiles is not None:
            out = out + self.profiles(ink_profiles(x)).reshape(x.shape[0])
        return out


MOMENTS = 5  # per channel: the centre of mass (x, y), their squares and their product


def image_moments(x: Tensor) -> Tensor:
    """(N, C, H, W) images in [-1, 1] -> (N, MOMENTS * C): where each channel's mass (its brightness) is centred,
    in pixels from the frame's centre, with the squares and the product, so that a linear read can prefer a
    place and a spread of places (a set centred by mass, as MNIST is, keeps its centres within a pixel, which
    a conv D only slowly learns to check)."""
    mass = (x.float() + 1).clamp(min=0) / 2
    total = mass.sum(dim=(2, 3)).clamp(min=1e-6)
    h, w = x.shape[2:]
    grid = coordinate_grid(x.float()) * torch.tensor([(w - 1) / 2, (h - 1) / 2], device=x.device).view(1, 2, 1, 1)
    cx = (mass * grid[:, :1]).sum(dim=(2, 3)) / total
    cy = (mass * grid[:, 1:]).sum(dim=(2, 3)) / total
    return torch.cat([cx, cy, cx * cx, cy * cy, cx * cy], dim=1).to(x.dtype)


def ink_profiles(x: Tensor) -> Tensor:
    """(N, C, H, W) -> (N, C * (H + W)): each row's and each column's brightest pixel, per channel: where the
    image's content starts and ends (MNIST scales every digit to a 20-pixel box, which the row profile shows)."""
    return torch.cat([x.amax(dim=3).flatten(1), x.amax(dim=2).flatten(1)], dim=1)


def coordinate_grid(x: Tensor) -> Tensor:
    """(1, 2, H, W): the column and the row of each pixel of ``x``'s frame, scaled to [-1, 1]."""
    h, w = x.shape[2:]
    rows = torch.linspace(-1, 1, h, device=x.device, dtype=x.dtype).view(1, 1, h, 1).expand(1, 1, h, w)
    cols = torch.linspace(-1, 1, w, device=x.device, dtype=x.dtype).view(1, 1, 1, w).expand(1, 1, h, w)
    return torch.cat([cols, rows], dim=1)
