"""The ring and grid data, and PacGAN's mode metrics, checked on constructed sample sets."""

from __future__ import annotations

import math

import pytest
import torch

from gan_accel.data import TOY_MIXTURES, gaussian_mixture, grid_centres, ring_centres
from gan_accel.eval.toy import mode_coverage


def test_the_ring_and_grid_are_pacgans():
    ring, ring_std = TOY_MIXTURES["ring"]
    assert ring_std == 0.01 and torch.allclose(ring[2], torch.tensor([0.0, 1.0]), atol=1e-6)
    assert torch.allclose(ring.norm(dim=1), torch.ones(8))
    grid, grid_std = TOY_MIXTURES["grid"]
    assert grid_std == 0.05 and grid.shape == (25, 2)
    assert {tuple(c) for c in grid.tolist()} == {(x, y) for x in (-4, -2, 0, 2, 4) for y in (-4, -2, 0, 2, 4)}


def test_real_data_captures_every_mode_with_high_quality_and_little_kl():
    for centres, std in TOY_MIXTURES.values():
        points, modes = gaussian_mixture(2500, centres, std, seed=1)
        result = mode_coverage(points, centres, std)
        # 3 std in 2-D holds 1 - exp(-4.5) = 98.9% of a Gaussian
        assert result["modes"] == len(centres) and 0.98 < result["high_quality"] < 0.996
        assert result["reverse_kl"] < 0.02


def test_a_collapsed_generator_captures_one_mode_at_kl_log_8():
    centres = ring_centres()
    samples = centres[3].expand(1000, 2).clone()
    result = mode_coverage(samples, centres, 0.01)
    assert result["modes"] == 1 and result["high_quality"] == 1.0 and result["mode_shares"][3] == 1.0
    assert result["reverse_kl"] == pytest.approx(math.log(8))


def test_quality_threshold_single_samples_and_kl_by_hand():
    centres = grid_centres()  # (-4, -4), (-4, -2), ...: index 12 is (0, 0), 13 is (0, 2)
    std = 0.05
    samples = torch.cat([
        torch.tensor([[0.0, 0.149]]).expand(60, 2),  # 2.98 std from (0, 0): high quality at mode 12
        torch.tensor([[0.0, 1.849]]).expand(30, 2),  # 3.02 std from (0, 2): not high quality
        torch.tensor([[4.0, 4.0]]).expand(20, 2),  # mode 24
        torch.tensor([[-4.0, -4.1]]),  # one sample, 2 std from mode 0: captures it
    ])
    result = mode_coverage(samples, centres, std)
    assert result["modes"] == 3 and result["high_quality"] == pytest.approx(81 / 111)
    p = torch.tensor([60, 20, 1], dtype=torch.float64) / 81
    assert result["reverse_kl"] == pytest.approx(float((p * (p * 25).log()).sum()))
    assert result["mode_shares"][12] == round(60 / 111, 4) and result["mode_shares"][13] == 0.0


def test_no_high_quality_sample_is_infinite_kl():
    result = mode_coverage(torch.full((10, 2), 0.5), ring_centres(), 0.01)
    assert result["modes"] == 0 and result["high_quality"] == 0.0 and result["reverse_kl"] == math.inf
