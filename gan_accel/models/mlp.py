"""Multi-layer perceptrons for low-dimensional data (e.g. 2-D toy distributions)."""

from __future__ import annotations

from torch import Tensor, nn


def _mlp(sizes: list[int], activation) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if index < len(sizes) - 2:
            layers.append(activation())
    return layers


class MLPGenerator(nn.Module):
    """``z_dim -> hidden x depth -> out_dim`` with ReLU; a linear output (no squashing)."""

    def __init__(self, z_dim: int = 2, out_dim: int = 2, hidden: int = 128, depth: int = 3) -> None:
        super().__init__()
        self.z_dim, self.out_dim = z_dim, out_dim
        self.net = nn.Sequential(*_mlp([z_dim] + [hidden] * depth + [out_dim], nn.ReLU))

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z)


class MLPDiscriminator(nn.Module):
    """``in_dim -> hidden x depth -> 1`` with LeakyReLU(0.2); one logit per sample."""

    def __init__(self, in_dim: int = 2, hidden: int = 128, depth: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(*_mlp([in_dim] + [hidden] * depth + [1], lambda: nn.LeakyReLU(0.2)))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(1)
