"""Evaluation: the Fréchet distance equals independent references (closed forms, numpy), feature batching does not
change features, the MNIST classifier is trained once and cached, and the MNIST report tells realism from coverage
(on real data; skipped when MNIST is not available)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from gan_accel.data import load_mnist_uint8, uint8_to_float
from gan_accel.eval import mnist as metrics
from gan_accel.eval import compute_features, feature_statistics, frechet_distance, frechet_distance_from_features
from gan_accel.eval.mnist import (
    ClassifierCacheError,
    MnistClassifier,
    evaluate_mnist_samples,
    format_evaluation,
    load_or_train_classifier,
    train_mnist_classifier,
)


def random_spd(dim: int, gen: torch.Generator) -> torch.Tensor:
    a = torch.randn(dim, dim, generator=gen, dtype=torch.float64)
    return a @ a.T / dim + 0.1 * torch.eye(dim, dtype=torch.float64)


# ----------------------------------------------------------------------------- Fréchet distance


def test_frechet_distance_diagonal_closed_form():
    gen = torch.Generator().manual_seed(0)
    mu1, mu2 = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    s1, s2 = torch.rand(6, generator=gen) + 0.1, torch.rand(6, generator=gen) + 0.1
    expected = ((mu1 - mu2) ** 2).sum() + (s1 + s2 - 2 * (s1 * s2).sqrt()).sum()
    got = frechet_distance(mu1, torch.diag(s1), mu2, torch.diag(s2))
    assert got == pytest.approx(float(expected), rel=1e-6)


def test_frechet_distance_full_covariance_matches_numpy_eig_reference():
    gen = torch.Generator().manual_seed(1)
    dim = 20
    mu1, mu2 = torch.randn(dim, generator=gen, dtype=torch.float64), torch.randn(dim, generator=gen, dtype=torch.float64)
    sigma1, sigma2 = random_spd(dim, gen), random_spd(dim, gen)
    # Reference computed another way: sigma1 @ sigma2 is non-symmetric but has real non-negative
    # eigenvalues; tr(sqrtm(sigma1 sigma2)) is the sum of their square roots.
    a, b = sigma1.numpy(), sigma2.numpy()
    eig = np.linalg.eigvals(a @ b)
    assert np.abs(eig.imag).max() < 1e-8
    expected = np.sum((mu1 - mu2).numpy() ** 2) + np.trace(a) + np.trace(b) - 2 * np.sqrt(eig.real).sum()
    assert frechet_distance(mu1, sigma1, mu2, sigma2) == pytest.approx(expected, rel=1e-9)
    # Symmetric in its two distributions, and float32 inputs give the same value (computed in float64).
    assert frechet_distance(mu2, sigma2, mu1, sigma1) == pytest.approx(expected, rel=1e-9)
    got32 = frechet_distance(mu1.float(), sigma1.float(), mu2.float(), sigma2.float())
    assert got32 == pytest.approx(expected, rel=1e-5)


def test_frechet_distance_handles_singular_covariance():
    # Rank-deficient covariances (fewer samples than dimensions) must not produce NaN.
    gen = torch.Generator().manual_seed(2)
    feats_a = torch.randn(5, 16, generator=gen)
    feats_b = torch.randn(5, 16, generator=gen) + 1.0
    value = frechet_distance_from_features(feats_a, feats_b)
    assert math.isfinite(value) and value > 0


def test_frechet_distance_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="covariances"):
        frechet_distance(torch.zeros(3), torch.eye(3), torch.zeros(3), torch.eye(4))
    with pytest.raises(ValueError, match="means"):
        frechet_distance(torch.zeros(3), torch.eye(3), torch.zeros(4), torch.eye(3))


def test_feature_statistics_match_numpy():
    feats = torch.randn(50, 7, generator=torch.Generator().manual_seed(3))
    mu, sigma = feature_statistics(feats)
    assert mu.dtype == sigma.dtype == torch.float64
    np.testing.assert_allclose(mu.numpy(), feats.double().numpy().mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(sigma.numpy(), np.cov(feats.double().numpy(), rowvar=False), rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="at least 2"):
        feature_statistics(feats[:1])


def test_fd_zero_for_identical_features_and_equals_squared_shift():
    feats = torch.randn(400, 12, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert frechet_distance_from_features(feats, feats) == pytest.approx(0.0, abs=1e-8)
    shift = torch.linspace(-1.0, 2.0, 12, dtype=torch.float64)
    # A pure shift leaves the covariance unchanged, so the distance is exactly |shift|^2.
    expected = float(shift @ shift)
    assert frechet_distance_from_features(feats, feats + shift) == pytest.approx(expected, rel=1e-8)
    assert frechet_distance_from_features(feats, feats + 2 * shift) == pytest.approx(4 * expected, rel=1e-8)


# ----------------------------------------------------------------------------- feature extraction


def test_compute_features_batching_matches_one_batch():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 26 * 26, 9))
    images = torch.rand(37, 1, 28, 28) * 2 - 1
    whole = net(images).detach()
    small = compute_features(net, images, batch_size=5)
    assert small.shape == (37, 9) and not small.requires_grad
    torch.testing.assert_close(small, whole, rtol=1e-5, atol=1e-6)
    # An iterable of (images, labels) batches, as a DataLoader yields, gives the same features.
    loader = [(images[i : i + 10], torch.zeros(len(images[i : i + 10]))) for i in range(0, 37, 10)]
    torch.testing.assert_close(compute_features(net, loader), whole, rtol=1e-5, atol=1e-6)
    # Any callable works, e.g. a bound method of a module.
    model = MnistClassifier()
    torch.testing.assert_close(
        compute_features(model.features, images, batch_size=8), model.features(images).detach(), rtol=1e-5, atol=1e-6
    )


def test_compute_features_rejects_bad_extractor_output():
    with pytest.raises(ValueError, match=r"\(N, F\)"):
        compute_features(lambda x: x.mean(), torch.zeros(4, 1, 28, 28))


# ----------------------------------------------------------------------------- classifier & caching


def fake_digits(n: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 1, 28, 28), generator=gen, dtype=torch.uint8), torch.randint(0, 10, (n,), generator=gen)


def test_training_is_deterministic_and_leaves_global_rng_alone():
    images, labels = fake_digits()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = train_mnist_classifier(images, labels, epochs=1, batch_size=64, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    b = train_mnist_classifier(images, labels, epochs=1, batch_size=64, seed=7)
    c = train_mnist_classifier(images, labels, epochs=1, batch_size=64, seed=8)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())
    assert not a.training


def test_load_or_train_trains_once_then_loads(tmp_path, monkeypatch):
    images, labels = fake_digits()
    calls = []
    real_train = metrics.train_mnist_classifier

    def counting_train(*args, **kwargs):
        calls.append(kwargs)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(metrics, "train_mnist_classifier", counting_train)
    cache = tmp_path / "sub" / "gan_accel_mnist_classifier.safetensors"
    first = load_or_train_classifier(cache, images, labels, epochs=1, batch_size=64)
    assert len(calls) == 1 and calls[0]["epochs"] == 1
    assert cache.is_file()
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]  # no temporary file left behind

    second = load_or_train_classifier(cache, images, labels, epochs=1, batch_size=64)
    assert len(calls) == 1, "second call must load the cache, not train"
    assert second is not first and not second.training
    for key, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[key])
    x = torch.rand(3, 1, 28, 28) * 2 - 1
    torch.testing.assert_close(first(x), second(x))


def test_corrupt_cache_gives_clear_error(tmp_path):
    images, labels = fake_digits(8)
    cache = tmp_path / "clf.safetensors"
    cache.write_bytes(b"this is not a safetensors file")
    with pytest.raises(ClassifierCacheError, match="delete the file") as info:
        load_or_train_classifier(cache, images, labels)
    assert str(cache) in str(info.value)


def test_cache_with_wrong_architecture_gives_clear_error(tmp_path):
    from safetensors.torch import save_file

    images, labels = fake_digits(8)
    cache = tmp_path / "clf.safetensors"
    state = {k: v.clone() for k, v in MnistClassifier().state_dict().items()}
    state["fc.weight"] = torch.zeros(64, state["fc.weight"].shape[1])
    save_file(state, str(cache))
    with pytest.raises(ClassifierCacheError, match="does not fit MnistClassifier.*fc.weight"):
        load_or_train_classifier(cache, images, labels)


# ----------------------------------------------------------------------------- MNIST evaluation


def mnist_root() -> Path:
    root = os.environ.get("GAN_ACCEL_MNIST_DIR", "/work/shared/data")
    if not (Path(root) / "MNIST" / "raw" / "train-images-idx3-ubyte").exists():
        pytest.skip(f"MNIST not found under {root!r} (set GAN_ACCEL_MNIST_DIR to a torchvision MNIST root)")
    return Path(root)


@pytest.fixture(scope="module")
def mnist():
    root = mnist_root()
    train_x, train_y = load_mnist_uint8(root, train=True, download=False)
    test_x, test_y = load_mnist_uint8(root, train=False, download=False)
    # A briefly trained classifier (5k images, 2 epochs, ~2 s, ~93% accurate) is enough to test the metric.
    classifier = train_mnist_classifier(train_x[:5000], train_y[:5000], epochs=2, batch_size=64)
    return {"train": (train_x, train_y), "test": (test_x, test_y), "classifier": classifier}


def test_brief_classifier_is_accurate(mnist):
    test_x, test_y = mnist["test"]
    logits = compute_features(mnist["classifier"], uint8_to_float(test_x[:2000]))
    assert (logits.argmax(1) == test_y[:2000]).float().mean() > 0.9


def test_evaluate_real_vs_noise_vs_collapsed(mnist):
    train_x, _ = mnist["train"]
    test_x, test_y = mnist["test"]
    classifier = mnist["classifier"]
    real = uint8_to_float(train_x[10000:13000])
    samples = uint8_to_float(test_x[:2000])

    good = evaluate_mnist_samples(samples, real, classifier)
    true_share = torch.bincount(test_y[:2000], minlength=10).double() / 2000
    assert len(good["class_share"]) == 10 and sum(good["class_share"]) == pytest.approx(1.0)
    assert np.abs(np.array(good["class_share"]) - true_share.numpy()).max() < 0.03
    assert good["min_class_share"] > 0.06
    assert good["class_entropy"] > 0.98 * math.log(10)
    assert good["mean_confidence"] > 0.85
    assert good["num_samples"] == 2000 and good["num_real"] == 3000
    # uint8 real images are accepted and mean the same thing as their [-1, 1] version.
    assert evaluate_mnist_samples(samples, train_x[10000:13000], classifier)["fd"] == pytest.approx(good["fd"], rel=1e-5)

    noise = torch.rand(2000, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 2 - 1
    bad = evaluate_mnist_samples(noise, real, classifier)
    # Only the distance is asserted for noise: classifiers can be confidently wrong far off-distribution.
    assert bad["fd"] > 20 * good["fd"]

    # Mode collapse: only ones. Most classes vanish and the distance grows.
    ones = uint8_to_float(test_x[:2000][test_y[:2000] == 1])
    collapsed = evaluate_mnist_samples(ones, real, classifier)
    assert collapsed["class_share"][1] > 0.95
    assert collapsed["min_class_share"] == 0.0
    assert collapsed["class_entropy"] < 0.5
    assert collapsed["fd"] > 5 * good["fd"]

    # Precision and recall split realism from coverage: real ones are realistic but cover one digit of
    # ten; noise covers nothing. (Noise's *precision* is not low here: a classifier maps noise onto a
    # few points that can fall inside the real manifold, which is why recall and FD are read with it.)
    assert good["precision"] > 0.6 and good["recall"] > 0.6
    assert collapsed["precision"] > 0.8 and collapsed["recall"] < 0.5 * good["recall"]
    assert bad["recall"] < 0.05
    assert bad["kid"] > 10 * good["kid"] and collapsed["kid"] > 10 * good["kid"]

    text = format_evaluation(good)
    assert text.startswith("MNIST evaluation")
    assert f"{good['fd']:.3f}" in text and "mean confidence" in text and "recall" in text and "KID" in text
    offline = format_evaluation({**good, "reference": "offline-digits"})
    assert "offline digit set, NOT MNIST" in offline.splitlines()[0]


def test_evaluate_rejects_wrong_image_shape(mnist):
    with pytest.raises(ValueError, match="samples"):
        evaluate_mnist_samples(torch.zeros(4, 3, 28, 28), torch.zeros(4, 1, 28, 28), mnist["classifier"])
