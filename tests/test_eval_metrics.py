"""KID, precision/recall and the Inception score, each against an independent numpy/scipy computation
or a closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from gan_accel.eval import inception_score, kernel_inception_distance, precision_recall, score_features
from gan_accel.eval.kid import subset_indices
from gan_accel.eval.precision_recall import knn_radii


def gaussian(n: int, d: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + shift


# -- KID -------------------------------------------------------------------------------------------------
def numpy_mmd2(x: np.ndarray, y: np.ndarray) -> float:
    d = x.shape[1]
    kxx, kyy, kxy = ((x @ x.T) / d + 1) ** 3, ((y @ y.T) / d + 1) ** 3, ((x @ y.T) / d + 1) ** 3
    m = len(x)
    total = 0.0
    for i in range(m):  # the unbiased estimator written out: every pair i != j
        for j in range(m):
            if i != j:
                total += kxx[i, j] + kyy[i, j]
    return total / (m * (m - 1)) - 2 * kxy.mean()


def twin_subsets(n_fake: int, n_real: int, num_subsets: int, m: int, seed: int) -> list[tuple[np.ndarray, ...]]:
    # the documented draw: one seeded generator, a fake permutation then a real one per subset, first m rows
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randperm(n_fake, generator=generator)[:m].numpy(),
             torch.randperm(n_real, generator=generator)[:m].numpy()) for _ in range(num_subsets)]


def test_kid_matches_a_numpy_twin_on_the_same_subsets():
    fake, real = gaussian(60, 5, 0), gaussian(50, 5, 1, shift=0.3)
    mean, std = kernel_inception_distance(fake, real, num_subsets=4, subset_size=20, seed=3)
    values = [numpy_mmd2(fake.numpy()[f], real.numpy()[r]) for f, r in twin_subsets(60, 50, 4, 20, 3)]
    assert mean == pytest.approx(np.mean(values), rel=1e-10)
    assert std == pytest.approx(np.std(values), rel=1e-10)  # population std (ddof=0), as torch-fidelity


def test_kid_subsets_are_capped_by_the_smaller_set_and_drawn_without_replacement():
    # subset_size 1000 > both sets: m = min(1000, 25, 18) = 18 rows of each
    draws = subset_indices(25, 18, 3, 1000, seed=7)
    for (f, r), (tf, tr) in zip(draws, twin_subsets(25, 18, 3, 18, 7)):
        assert len(f) == len(r) == 18 and len(set(f.tolist())) == 18 and len(set(r.tolist())) == 18
        assert f.max() < 25 and r.max() < 18
        assert np.array_equal(f.numpy(), tf) and np.array_equal(r.numpy(), tr)
    fake, real = gaussian(25, 3, 0), gaussian(18, 3, 1)
    values = [numpy_mmd2(fake.numpy()[f], real.numpy()[r]) for f, r in twin_subsets(25, 18, 3, 18, 7)]
    assert kernel_inception_distance(fake, real, 3, 1000, seed=7)[0] == pytest.approx(np.mean(values), rel=1e-10)


def test_kid_is_near_zero_for_one_distribution_and_grows_with_a_shift():
    same_mean, same_std = kernel_inception_distance(gaussian(800, 8, 0), gaussian(800, 8, 1), 20, 400)
    near, _ = kernel_inception_distance(gaussian(800, 8, 0, 0.2), gaussian(800, 8, 1), 20, 400)
    far, _ = kernel_inception_distance(gaussian(800, 8, 0, 1.0), gaussian(800, 8, 1), 20, 400)
    assert abs(same_mean) < 3 * same_std + 1e-3
    assert same_mean < near < far


def test_kid_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    kernel_inception_distance(gaussian(30, 3, 0), gaussian(30, 3, 1), 3, 10)
    assert torch.equal(state, torch.get_rng_state())


# -- precision and recall --------------------------------------------------------------------------------
def scipy_precision_recall(fake: np.ndarray, real: np.ndarray, k: int) -> tuple[float, float]:
    def radii(points):
        return np.sort(cdist(points, points), axis=1)[:, k]  # column 0 is the point itself

    precision = (cdist(fake, real) <= radii(real)[None, :]).any(axis=1).mean()
    recall = (cdist(real, fake) <= radii(fake)[None, :]).any(axis=1).mean()
    return float(precision), float(recall)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_precision_recall_match_a_scipy_twin(k):
    fake, real = gaussian(70, 4, 0, shift=0.5), gaussian(90, 4, 1)
    expected = scipy_precision_recall(fake.numpy(), real.numpy(), k)
    assert precision_recall(fake, real, k=k) == pytest.approx(expected, abs=1e-12)


def test_blocked_distances_equal_unblocked():
    fake, real = gaussian(40, 3, 0), gaussian(33, 3, 1)
    assert precision_recall(fake, real, k=2, batch_size=7) == precision_recall(fake, real, k=2, batch_size=10_000)
    assert torch.allclose(knn_radii(real, 2, batch_size=5), knn_radii(real, 2, batch_size=1000))


def test_precision_recall_by_hand_in_one_dimension():
    real = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    # k = 1. Each real point's nearest other real point is 1 away: every real radius is 1.
    # Fake [0.5, 10]: each one's only other fake point is 9.5 away: both fake radii are 9.5.
    # Precision: 0.5 is 0.5 <= 1 from real 0 (inside); 10 is 7 > 1 from real 3 (outside) -> 1/2.
    # Recall: every real point is within 9.5 of fake 0.5 (at most 2.5 away) -> 4/4.
    assert precision_recall(torch.tensor([[0.5], [10.0]]), real, k=1) == (0.5, 1.0)
    # k = 1, fake [4, 10]: 4 is exactly 1 from real 3, on the boundary of its ball, which counts as
    # inside (distance <= radius) -> precision 1/2. Both fake radii are 6 and every real point is at
    # most 4 from fake 4 -> recall 1.
    assert precision_recall(torch.tensor([[4.0], [10.0]]), real, k=1) == (0.5, 1.0)
    # k = 1, fake [0, 0.2, 0.4]: fake radii 0.2, 0.2, 0.2. Precision: all within 1 of real 0 -> 1.
    # Recall: real 0 is 0 from fake 0 (inside); real 1 is 0.6 > 0.2 from fake 0.4, 2 and 3 further -> 1/4.
    assert precision_recall(torch.tensor([[0.0], [0.2], [0.4]]), real, k=1) == (1.0, 0.25)
    # k = 2, fake [0.5, 10, 10.5]. Fake radii: 0.5 -> 10 (others at 9.5, 10), 10 -> 9.5 (0.5, 9.5),
    # 10.5 -> 10 (0.5, 10). Real radii: 0 -> 2 (others at 1, 2, 3), 1 -> 1, 2 -> 1, 3 -> 2.
    # Precision: 0.5 is inside (0.5 from real 0), 10 and 10.5 are >= 7 from every real point -> 1/3.
    # Recall: every real point is within 10 of fake 0.5 -> 1.
    assert precision_recall(torch.tensor([[0.5], [10.0], [10.5]]), real, k=2) == pytest.approx((1 / 3, 1.0))


def test_identical_sets_score_one_and_distant_sets_zero():
    x = gaussian(50, 3, 0)
    assert precision_recall(x, x.clone()) == (1.0, 1.0)
    assert precision_recall(x + 100.0, x) == (0.0, 0.0)


# -- Inception score ---------------------------------------------------------------------------------------
def test_inception_score_matches_a_numpy_twin():
    logits = gaussian(100, 6, 4) * 3
    mean, std = inception_score(logits, splits=4)
    p = np.exp(logits.numpy() - logits.numpy().max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    scores = []
    for part in np.array_split(p, 4):
        marginal = part.mean(0)
        scores.append(np.exp(np.mean(np.sum(part * (np.log(part) - np.log(marginal)), axis=1))))
    assert mean == pytest.approx(np.mean(scores), rel=1e-10)
    assert std == pytest.approx(np.std(scores), rel=1e-10)


def test_inception_score_closed_forms():
    confident = torch.full((40, 4), -1e4, dtype=torch.float64)
    confident[torch.arange(40), torch.arange(40) % 4] = 0.0  # sure of one class each, spread evenly
    assert inception_score(confident, splits=2)[0] == pytest.approx(4.0, rel=1e-9)
    same = torch.tensor([[2.0, 0.5, -1.0]]).repeat(30, 1)  # identical predictions: no information
    assert inception_score(same, splits=3)[0] == pytest.approx(1.0, abs=1e-12)
    # exactly one-hot (-inf elsewhere): 0 * log 0 terms must count as 0, not NaN
    one_hot = torch.full((12, 3), -math.inf, dtype=torch.float64)
    one_hot[torch.arange(12), torch.arange(12) % 3] = 0.0
    assert inception_score(one_hot, splits=4) == pytest.approx((3.0, 0.0), abs=1e-12)
    # the std is over splits: a split of identical predictions (IS 1) and one spread over 2 classes (IS 2)
    mixed = torch.full((8, 2), -1e4, dtype=torch.float64)
    mixed[torch.arange(8), torch.tensor([0, 0, 0, 0, 0, 1, 0, 1])] = 0.0
    assert inception_score(mixed, splits=2) == pytest.approx((1.5, 0.5), rel=1e-9)


# -- together, and bad input ---------------------------------------------------------------------------------
def test_score_features_collects_every_score():
    fake, real = gaussian(60, 4, 0), gaussian(60, 4, 1)
    scores = score_features(fake, real, gaussian(60, 10, 2), kid_subsets=5, kid_subset_size=30, is_splits=3)
    assert set(scores) == {"fd", "kid", "kid_std", "precision", "recall", "is", "is_std"}
    assert (scores["precision"], scores["recall"]) == precision_recall(fake, real)
    assert scores["is"] == pytest.approx(inception_score(gaussian(60, 10, 2), 3)[0])
    assert not math.isnan(scores["fd"])


@pytest.mark.parametrize("call, match", [
    (lambda: kernel_inception_distance(gaussian(10, 3, 0), gaussian(10, 4, 0)), "different widths"),
    (lambda: precision_recall(gaussian(3, 2, 0), gaussian(10, 2, 0), k=3), "k=3 needs more samples"),
    (lambda: precision_recall(gaussian(10, 2, 0)[0], gaussian(10, 2, 0)), r"must be \(N, F\)"),
    (lambda: inception_score(gaussian(10, 3, 0), splits=11), "splits=11"),
    (lambda: kernel_inception_distance(gaussian(1, 3, 0), gaussian(10, 3, 0)), "at least 2 samples"),
    (lambda: precision_recall(gaussian(10, 2, 0), gaussian(10, 3, 0)), "different widths"),
    (lambda: precision_recall(gaussian(10, 2, 0), gaussian(10, 2, 0), k=0), "k=0"),
    (lambda: score_features(gaussian(10, 2, 0), gaussian(10, 2, 1), gaussian(9, 4, 2), kid_subsets=2,
                            kid_subset_size=5), "one row per fake"),
])
def test_bad_input_names_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()
