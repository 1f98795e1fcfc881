"""Each loss equals its textbook formula, computed a different way (probabilities, torch built-ins)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gan_accel.objectives.losses import LOSSES, get_loss


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, generator=g, dtype=torch.float64) * 3, torch.randn(64, generator=g, dtype=torch.float64) * 3


def test_nonsaturating_matches_binary_cross_entropy_on_probabilities(logits):
    real, fake = logits
    p_real, p_fake = torch.sigmoid(real), torch.sigmoid(fake)
    expected_d = F.binary_cross_entropy(p_real, torch.ones_like(p_real)) + F.binary_cross_entropy(p_fake, torch.zeros_like(p_fake))
    expected_g = -torch.log(p_fake).mean()
    loss = LOSSES["nonsaturating"]
    torch.testing.assert_close(loss.d_loss(real, fake), expected_d)
    torch.testing.assert_close(loss.g_loss(fake), expected_g)


def test_nonsaturating_is_stable_for_extreme_logits():
    loss = LOSSES["nonsaturating"]
    big = torch.tensor([200.0, -200.0])
    assert torch.isfinite(loss.d_loss(big, -big)) and torch.isfinite(loss.g_loss(-big))


def test_hinge_wasserstein_least_squares_match_elementwise_formulas(logits):
    real, fake = logits
    expected = {
        "hinge": (sum(max(0.0, 1 - r) for r in real.tolist()) / 64 + sum(max(0.0, 1 + f) for f in fake.tolist()) / 64,
                  -sum(fake.tolist()) / 64),
        "wasserstein": (sum(fake.tolist()) / 64 - sum(real.tolist()) / 64, -sum(fake.tolist()) / 64),
        "least_squares": (sum(0.5 * (r - 1) ** 2 for r in real.tolist()) / 64 + sum(0.5 * f**2 for f in fake.tolist()) / 64,
                          sum(0.5 * (f - 1) ** 2 for f in fake.tolist()) / 64),
    }
    for name, (d_value, g_value) in expected.items():
        assert LOSSES[name].d_loss(real, fake).item() == pytest.approx(d_value, rel=1e-12), name
        assert LOSSES[name].g_loss(fake).item() == pytest.approx(g_value, rel=1e-12), name


def test_mean_of_micro_batch_losses_equals_loss_of_whole_batch(logits):
    """The property gradient accumulation relies on: each loss is a per-sample mean."""
    real, fake = logits
    for name, loss in LOSSES.items():
        whole = loss.d_loss(real, fake)
        parts = sum(loss.d_loss(r, f) for r, f in zip(real.chunk(4), fake.chunk(4))) / 4
        torch.testing.assert_close(parts, whole, msg=name)


def test_unknown_loss_name_lists_the_choices():
    with pytest.raises(ValueError, match="choose one of hinge, least_squares, nonsaturating, rpgan, wasserstein"):
        get_loss("vanilla")
