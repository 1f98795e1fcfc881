"""Inception features: the uint8/RGB wiring is right (checked with a stand-in network), the weights are looked up
locally first (with downloads off, never fetched), and a missing torch-fidelity or weights file is one clear error.
The download itself: tests/test_inception_fetch.py."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

import gan_accel.eval.inception as inception
from gan_accel.data.loader import uint8_to_float
from gan_accel.eval.features import compute_features
from gan_accel.eval.frechet import frechet_distance_from_features
from gan_accel.eval.inception import (
    WEIGHTS_ENV,
    WEIGHTS_FILE,
    InceptionExtractor,
    InceptionUnavailable,
    inception_extractor,
)
from gan_accel.errors import GanAccelError

FEATS, CLASSES = 16, 10


class StandIn(nn.Module):
    """Takes what torch-fidelity's Inception takes (uint8 N x 3 x H x W) and records it."""

    def __init__(self, weights: str, features_list: list[str]) -> None:
        super().__init__()
        self.weights, self.features_list = weights, features_list
        self.proj = nn.Linear(3, FEATS)
        self.head = nn.Linear(FEATS, CLASSES)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor):
        assert x.dtype == torch.uint8 and x.ndim == 4 and x.shape[1] == 3, (x.dtype, x.shape)
        self.seen.append(x.clone())
        pooled = x.float().mean(dim=(2, 3)) / 255
        feats = self.proj(pooled)
        return feats, self.head(feats)


@pytest.fixture
def weights_file(tmp_path: Path) -> Path:
    path = tmp_path / WEIGHTS_FILE
    path.write_bytes(b"stand-in")
    return path


@pytest.fixture
def no_weights_anywhere(monkeypatch, tmp_path: Path) -> Path:
    """No env var, an empty torch hub cache under tmp_path; returns the hub dir."""
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    hub = Path(torch.hub.get_dir())
    assert str(hub).startswith(str(tmp_path)), "torch.hub.set_dir was called elsewhere; TORCH_HOME is ignored"
    return hub


def expected_uint8(images: torch.Tensor) -> torch.Tensor:
    """Independent reference: per pixel, round-half-even of (x + 1) * 127.5 in float64, clipped."""
    out = torch.empty(images.shape, dtype=torch.uint8)
    flat_in, flat_out = images.double().flatten().tolist(), out.view(-1)
    for i, v in enumerate(flat_in):
        flat_out[i] = int(min(255, max(0, round((v + 1) * 127.5))))
    return out.repeat(1, 3, 1, 1) if images.shape[1] == 1 else out


def stand_in_extractor(weights: Path) -> tuple[InceptionExtractor, list[StandIn]]:
    built: list[StandIn] = []

    def factory(path: str, features_list: list[str]) -> StandIn:
        torch.manual_seed(0)
        built.append(StandIn(path, features_list))
        return built[-1]

    return inception_extractor(weights, _backend=factory), built


@pytest.mark.parametrize("shape", [(5, 1, 28, 28), (4, 3, 32, 32)])
def test_images_reach_backend_as_uint8_rgb(weights_file, shape):
    ext, built = stand_in_extractor(weights_file)
    net = built[0]
    assert net.weights == str(weights_file) and net.features_list == ["2048", "logits_unbiased"]
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(shape, generator=gen) * 2.2 - 1.1  # a little outside [-1, 1]: clamped
    images[0, :, 0, :4] = torch.tensor([-1.0, 0.0, 1.0, 0.5])
    # The project's own decode of uint8 round-trips exactly through the quantisation.
    images[1] = uint8_to_float(torch.arange(shape[1] * shape[2] * shape[3]).remainder(256).reshape(shape[1:]))
    with pytest.raises(RuntimeError, match="expected 2048"):
        ext(images)  # the stand-in's 16 features are caught by the width check
    ext.feature_layer = str(FEATS)
    feats = ext(images)
    sent = net.seen[-1]
    assert torch.equal(sent, expected_uint8(images))
    assert sent[0, :, 0, :4].tolist() == [[0, 128, 255, 191]] * 3
    assert torch.equal(sent[1, 0].flatten()[:256], torch.arange(256, dtype=torch.uint8))
    assert feats.shape == (shape[0], FEATS) and feats.dtype == torch.float32
    logits = ext.logits(images)
    assert logits.shape == (shape[0], CLASSES) and logits.dtype == torch.float32
    f2, l2 = ext.features_and_logits(images)
    assert torch.equal(f2, feats) and torch.equal(l2, logits)


def test_compute_features_and_frechet_with_stand_in(weights_file):
    ext, built = stand_in_extractor(weights_file)
    ext.feature_layer = str(FEATS)
    gen = torch.Generator().manual_seed(2)
    a = torch.rand(10, 1, 28, 28, generator=gen) * 2 - 1
    b = torch.rand(12, 1, 28, 28, generator=gen) * 2 - 1
    fa = compute_features(ext, a, batch_size=4)
    fb = compute_features(ext, b, batch_size=5)
    assert fa.shape == (10, FEATS) and fb.shape == (12, FEATS)
    assert [t.shape[0] for t in built[0].seen] == [4, 4, 2, 5, 5, 2]
    assert torch.allclose(fa, ext(a), atol=1e-6)  # batching changes nothing
    assert frechet_distance_from_features(fa, fb) >= 0.0
    assert frechet_distance_from_features(fa, fa) == pytest.approx(0.0, abs=1e-6)


def test_network_stays_in_eval_mode(weights_file):
    ext, built = stand_in_extractor(weights_file)
    ext.train()
    assert ext.training and not built[0].training


def test_bad_inputs_are_refused(weights_file):
    ext, _ = stand_in_extractor(weights_file)
    with pytest.raises(ValueError, match="1 or 3"):
        ext(torch.zeros(2, 2, 8, 8))
    with pytest.raises(ValueError, match="NaN"):
        ext(torch.full((2, 3, 8, 8), float("nan")))
    with pytest.raises(ValueError, match="uint8"):
        ext(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="2048"):
        inception_extractor(weights_file, features="1000", _backend=StandIn)


def test_weights_found_through_env_var_and_hub_cache(monkeypatch, no_weights_anywhere, weights_file):
    seen: list[str] = []

    def factory(path: str, features_list: list[str]) -> StandIn:
        seen.append(path)
        return StandIn(path, features_list)

    cached = no_weights_anywhere / "checkpoints" / WEIGHTS_FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"stand-in")
    stand_in_hash = hashlib.sha256(b"stand-in").hexdigest()  # what the cache is held to
    monkeypatch.setattr(inception, "WEIGHTS", replace(inception.WEIGHTS, sha256=stand_in_hash))
    inception_extractor(_backend=factory)
    monkeypatch.setenv(WEIGHTS_ENV, str(weights_file))
    inception_extractor(_backend=factory)
    assert seen == [str(cached), str(weights_file)]


def fail_on_download(monkeypatch):
    def no_network(*args, **kwargs):
        pytest.fail("a download was attempted")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_network)
    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    fidelity = sys.modules.get("torch_fidelity.feature_extractor_inceptionv3")
    if fidelity is not None:  # it binds load_state_dict_from_url at its import
        monkeypatch.setattr(fidelity, "load_state_dict_from_url", no_network)


def test_missing_weights_with_downloads_off(monkeypatch, no_weights_anywhere):
    import urllib.request

    fail_on_download(monkeypatch)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("a download was attempted"))
    with pytest.raises(InceptionUnavailable) as info:
        inception_extractor(download=False, _backend=StandIn)
    message = str(info.value)
    assert "\n" not in message
    assert WEIGHTS_FILE in message and WEIGHTS_ENV in message and str(no_weights_anywhere / "checkpoints") in message
    assert isinstance(info.value, GanAccelError) and isinstance(info.value, RuntimeError)
    assert not (no_weights_anywhere / "checkpoints" / WEIGHTS_FILE).exists()
    pytest.importorskip("torch_fidelity")
    import torch_fidelity.feature_extractor_inceptionv3  # noqa: F401  (so its binding gets patched)

    fail_on_download(monkeypatch)
    with pytest.raises(InceptionUnavailable, match="downloads are off"):
        inception_extractor(download=False)  # torch-fidelity's own download is never reached either


def test_library_missing(monkeypatch, weights_file):
    monkeypatch.setitem(sys.modules, "torch_fidelity", None)
    monkeypatch.setitem(sys.modules, "torch_fidelity.feature_extractor_inceptionv3", None)
    with pytest.raises(InceptionUnavailable) as info:
        inception_extractor(weights_file)
    message = str(info.value)
    assert "\n" not in message and "pip install 'gan_accel[inception]'" in message


def test_weights_path_that_does_not_exist(monkeypatch, tmp_path, no_weights_anywhere):
    missing = tmp_path / "nowhere" / WEIGHTS_FILE
    with pytest.raises(InceptionUnavailable, match="does not exist") as info:
        inception_extractor(missing, _backend=StandIn)
    assert str(missing) in str(info.value) and "\n" not in str(info.value)
    monkeypatch.setenv(WEIGHTS_ENV, str(missing))
    with pytest.raises(InceptionUnavailable) as info:
        inception_extractor(_backend=StandIn)
    assert str(missing) in str(info.value) and WEIGHTS_ENV in str(info.value)
    pytest.importorskip("torch_fidelity")
    with pytest.raises(InceptionUnavailable, match="does not exist") as info:
        inception_extractor(missing)  # the real backend path: checked before torch-fidelity's torch.load
    assert str(missing) in str(info.value)


def test_unreadable_weights_file_is_one_line_error(weights_file):
    pytest.importorskip("torch_fidelity")
    with pytest.raises(InceptionUnavailable, match="cannot (read|load) ") as info:
        inception_extractor(weights_file)  # "stand-in" bytes are no checkpoint
    assert "\n" not in str(info.value) and str(weights_file) in str(info.value) and WEIGHTS_FILE in str(info.value)


def test_real_torch_fidelity_network_wiring(monkeypatch, tmp_path):
    """The real torch-fidelity constructor and forward, with random weights (the real file is not here)."""
    pytest.importorskip("torch_fidelity")
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    fail_on_download(monkeypatch)
    loaded: list[str] = []
    real_load = torch.load

    def recording_load(path, *args, **kwargs):
        loaded.append((str(path), kwargs.get("weights_only")))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    monkeypatch.setattr(FeatureExtractorInceptionV3, "load_state_dict", lambda self, state, *a, **k: None)
    path = tmp_path / WEIGHTS_FILE
    torch.save({}, path)
    torch.manual_seed(0)
    ext = inception_extractor(path)
    # gan_accel's own check first (nothing in the file can run), then torch-fidelity's read of the same file
    assert loaded[0] == (str(path), True) and {name for name, _ in loaded} == {str(path)}
    gen = torch.Generator().manual_seed(3)
    gray = torch.rand(2, 1, 28, 28, generator=gen) * 2 - 1
    feats, logits = ext.features_and_logits(gray)
    assert feats.shape == (2, 2048) and logits.shape == (2, 1008)
    assert feats.dtype == torch.float32 and torch.isfinite(feats).all() and torch.isfinite(logits).all()
