"""Mode coverage of 2-D samples, checked on constructed sample sets."""

from __future__ import annotations

import torch

from gan_accel.data import ring_centres, ring_of_gaussians
from gan_accel.eval.toy import mode_coverage


def test_real_data_covers_every_mode_with_high_quality():
    points, modes = ring_of_gaussians(5000, seed=1)
    result = mode_coverage(points, ring_centres())
    assert result["modes"] == 8 and result["high_quality"] == 1.0  # 0.12 is 6 standard deviations
    shares = torch.bincount(modes, minlength=8).double() / 5000
    assert result["mode_shares"] == [round(float(s), 4) for s in shares]


def test_a_collapsed_generator_covers_one_mode():
    centres = ring_centres()
    samples = centres[3] + 0.01 * torch.randn(1000, 2, generator=torch.Generator().manual_seed(0))
    result = mode_coverage(samples, centres)
    assert result["modes"] == 1 and result["high_quality"] == 1.0 and result["mode_shares"][3] == 1.0


def test_samples_between_modes_are_not_high_quality_and_rare_modes_do_not_count():
    centres = ring_centres()
    between = (centres[0] + centres[1]) / 2  # 0.77 from both
    samples = torch.cat([between.expand(900, 2), centres[0].expand(95, 2), centres[5].expand(5, 2)])
    result = mode_coverage(samples, centres, min_share=0.01)
    assert result["high_quality"] == 0.1
    assert result["modes"] == 1  # mode 5 holds 0.5% of the samples: below 1%
