"""gan_accel.sampling.interpolate: latent walks by slerp, their endpoints, seeds and classes."""

from __future__ import annotations

import math

import pytest
import torch

from gan_accel.errors import ConfigError
from gan_accel.models import DCGANGenerator
from gan_accel.sampling import interpolate, slerp

Z = 6


def small_g() -> torch.nn.Module:
    torch.manual_seed(0)
    return DCGANGenerator(z_dim=Z, width=4, image_size=28).double().eval()


def endpoints(walks: int, seed: int) -> torch.Tensor:
    """What interpolate documents: randn(walks, 2, z_dim) from the seed, on the CPU (float32, then G's dtype)."""
    return torch.randn(walks, 2, Z, generator=torch.Generator().manual_seed(seed)).double()


class LabelRecordingG(torch.nn.Module):
    """A conditional G whose image is its latent's mean plus its label, and which records the labels it gets."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes, self.z_dim, self.seen = num_classes, Z, []
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.seen.append(y.clone())
        return (z.mean(1) * self.scale + y).view(-1, 1, 1, 1).expand(-1, 1, 2, 2)


def test_the_grid_is_walks_by_steps_and_its_ends_are_g_of_the_seeds_latents():
    G = small_g()
    images = interpolate(G, walks=3, steps=5, seed=4)
    assert images.shape == (15, 1, 28, 28)
    rows = images.reshape(3, 5, 1, 28, 28)
    ends = endpoints(3, 4)
    with torch.no_grad():
        first, last = G(ends[:, 0]), G(ends[:, 1])
    assert torch.equal(rows[:, 0], first) and torch.equal(rows[:, -1], last)
    assert not torch.equal(rows[:, 1], first)  # the inner steps are other latents


def test_the_same_seed_gives_the_same_walks_and_another_seed_others():
    G = small_g()
    assert torch.equal(interpolate(G, 2, 4, seed=1), interpolate(G, 2, 4, seed=1))
    assert not torch.equal(interpolate(G, 2, 4, seed=1), interpolate(G, 2, 4, seed=2))
    assert interpolate(G).shape[0] == 8 * 10  # the default: 8 walks of 10 steps


def test_slerp_moves_at_a_constant_angle_on_the_sphere():
    a, b = torch.randn(2, 2, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, b = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    t = torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64)
    path = slerp(a, b, t)
    omega = torch.acos((a * b).sum(1))
    for w in range(2):
        for i, fraction in enumerate(t.tolist()):
            point = path[w, i]
            assert float(point.norm()) == pytest.approx(1.0, abs=1e-12)  # stays on the unit sphere
            angle = math.acos(max(-1.0, min(1.0, float(point @ a[w]))))
            assert angle == pytest.approx(fraction * float(omega[w]), abs=1e-6)
    assert torch.equal(path[:, 0], a) and torch.equal(path[:, -1], b)
    same = slerp(a[:1], a[:1].clone(), t)  # endpoints in one direction: a straight line, no division by zero
    assert torch.isfinite(same).all() and torch.allclose(same[0], a[:1].expand(4, -1))


def test_a_conditional_runs_walks_keep_their_class():
    G = LabelRecordingG(num_classes=3)
    images = interpolate(G, walks=4, steps=3, seed=0)
    assert torch.equal(torch.cat(G.seen), torch.tensor([0, 1, 2, 0]).repeat_interleave(3))
    expected_first = endpoints(4, 0)[:, 0].float().mean(1) + torch.tensor([0.0, 1.0, 2.0, 0.0])
    assert torch.allclose(images.reshape(4, 3, -1)[:, 0, 0], expected_first, atol=1e-6)
    G.seen.clear()
    interpolate(G, steps=2, label=2)
    assert torch.equal(torch.cat(G.seen), torch.full((16,), 2))  # 8 walks, all in class 2
    G.seen.clear()
    assert interpolate(G, steps=2).shape[0] == 3 * 2  # default: one walk per class


@pytest.mark.parametrize("kwargs, says", [
    (dict(walks=0), "walks=0: ask for 1 to 100 walks"),
    (dict(steps=1), "steps=1: ask for 2 to 100 steps"),
    (dict(walks=101), "walks=101"),
    (dict(label=1), "this run is unconditional"),
])
def test_what_a_run_cannot_give_is_one_line(kwargs, says):
    with pytest.raises(ConfigError, match=says):
        interpolate(small_g(), **kwargs)
