"""VGG-16 fc2 features for precision and recall: the TensorFlow-1 resize against values worked by hand, the features
against torchvision's VGG-16 run by hand on the same weights, precision and recall in that space against a hand
computation, and the weights through the same cache, download and one-line errors as Inception's (a stand-in
weights file of random numbers: the real one is not here)."""

from __future__ import annotations

import argparse
import hashlib
import math
import pickle
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torchvision

import gan_accel.eval.vgg as vgg
from gan_accel.eval import INCEPTION_NAME, VGG_NAME, VGGUnavailable, score_features, vgg16_extractor
from gan_accel.eval.vgg import WEIGHTS_ENV, WEIGHTS_FILE, precision_recall_features, resize_like_tf1
from test_inception_fetch import no_proxy, send, serve  # noqa: F401  (fixtures: the loopback server)


def stand_in_state() -> dict[str, torch.Tensor]:
    """Random VGG-16 weights, each weight a strided view of a short random vector (w[i, j, ...] = v[i + j + ...]):
    a full-shaped state dict of 138M parameters saved in 260 kB, so writing and hashing it costs nothing."""
    generator = torch.Generator().manual_seed(0)
    with torch.device("meta"):
        shapes = {key: value.shape for key, value in torchvision.models.vgg16().state_dict().items()}
    state = {}
    for key, shape in shapes.items():
        if key.endswith("bias"):
            state[key] = torch.randn(shape, generator=generator) * 0.01
        else:
            scale = math.sqrt(2.0 / math.prod(shape[1:]))  # He's: activations neither vanish nor explode
            state[key] = (torch.randn(sum(shape), generator=generator) * scale).as_strided(shape, (1,) * len(shape))
    return state


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    path = tmp_path_factory.mktemp("vgg") / WEIGHTS_FILE
    state = stand_in_state()
    torch.save(state, path)
    return path, state


@pytest.fixture
def hub(monkeypatch, tmp_path, stand_in) -> Path:
    """An empty torch hub cache under tmp_path whose VGG-16 file is held to the stand-in's hash; returns the path
    the weights are cached at."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    digest = hashlib.sha256(stand_in[0].read_bytes()).hexdigest()
    monkeypatch.setattr(vgg, "WEIGHTS", replace(vgg.WEIGHTS, sha256=digest))
    return vgg.WEIGHTS.cache_path


def test_the_resize_is_tensorflow_1s_bilinear_worked_by_hand():
    # up: output pixel i reads input i / 2, the last ones repeat the edge; rows are interpolated like columns
    x = torch.tensor([[0.0, 10.0], [20.0, 30.0]]).view(1, 1, 2, 2)
    assert resize_like_tf1(x, 4)[0, 0].tolist() == [[0, 5, 10, 10], [10, 15, 20, 20], [20, 25, 30, 30],
                                                    [20, 25, 30, 30]]
    # down: output pixel i reads input 2i, with no averaging of its neighbours (TensorFlow 1's, not antialiased)
    y = torch.arange(16.0).view(1, 1, 4, 4)
    assert resize_like_tf1(y, 2)[0, 0].tolist() == [[0, 2], [8, 10]]
    assert torch.equal(resize_like_tf1(y.expand(2, 3, 4, 4), 4), y.expand(2, 3, 4, 4))  # its own size: unchanged


def test_fc2_features_equal_torchvision_vgg16_run_by_hand(hub, stand_in):
    """Two 224-px images (no resize then) through the extractor, which finds the weights in the cache, and through
    torchvision's VGG-16 loaded the usual way with the same state dict, normalised and cut at fc2 by hand."""
    path, state = stand_in
    hub.parent.mkdir(parents=True)
    hub.write_bytes(path.read_bytes())
    extractor = vgg16_extractor(download=False)
    pixels = torch.randint(0, 256, (2, 3, 224, 224), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    features = extractor(pixels.float() / 127.5 - 1)  # [-1, 1] quantises back to these pixels exactly
    net = torchvision.models.vgg16()
    net.load_state_dict(state)
    net.eval()
    with torch.no_grad():
        x = torchvision.transforms.functional.normalize(pixels.float(), [255 * m for m in (0.485, 0.456, 0.406)],
                                                        [255 * s for s in (0.229, 0.224, 0.225)])
        fc1 = torch.relu(net.classifier[0](torch.flatten(net.avgpool(net.features(x)), 1)))
        expected = torch.relu(net.classifier[3](fc1))
    assert features.shape == (2, 4096) and features.dtype == torch.float32 and (features > 0).any()
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    assert not extractor.train().training  # dropout stays off


def test_the_same_features_as_torch_fidelitys_extractor(stand_in):
    """Where torch-fidelity is installed: its VGG-16 extractor (fc2 after ReLU) on the same weights and images."""
    pytest.importorskip("torch_fidelity")
    from torch_fidelity.feature_extractor_vgg16 import FeatureExtractorVGG16

    path, _ = stand_in
    theirs = FeatureExtractorVGG16("vgg16", ["fc2_relu"], feature_extractor_weights_path=str(path))
    pixels = torch.randint(0, 256, (2, 3, 48, 40), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    ours = vgg16_extractor(path)(pixels.float() / 127.5 - 1)
    expected = theirs(pixels)[0]
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_precision_and_recall_in_vgg_features_equal_a_hand_computation():
    """Real points 0, 1, 2, 3 reach their 3rd neighbour at 3, 2, 2, 3: of the samples 0.5, 1.5, 10, 20 two are
    inside (precision 1/2); the samples' radii are 19.5, 18.5, 10, 19.5, so every real point is covered (recall 1)."""
    pr_real, pr_fake = torch.tensor([[0.0], [1.0], [2.0], [3.0]]), torch.tensor([[0.5], [1.5], [10.0], [20.0]])
    fake, real = torch.randn(4, 5), torch.randn(4, 5)  # the distance's space: not where precision is measured
    scores = score_features(fake, real, kid_subset_size=4, features=INCEPTION_NAME, pr_fake=pr_fake, pr_real=pr_real,
                            pr_features=VGG_NAME)
    assert (scores[f"precision_{VGG_NAME}"], scores[f"recall_{VGG_NAME}"]) == (0.5, 1.0)
    assert {"fid", "kid", "kid_std"} < set(scores) and "precision" not in scores
    with pytest.raises(ValueError, match="pr_fake and pr_real come together"):
        score_features(fake, real, kid_subset_size=4, pr_fake=pr_fake)


def test_offline_the_line_names_the_file_the_folder_and_the_variable(hub, monkeypatch):
    def no_dns(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)  # what a machine without a network answers
    monkeypatch.setattr(vgg, "WEIGHTS", replace(vgg.WEIGHTS, url=f"https://weights.example/{WEIGHTS_FILE}"))
    with pytest.raises(VGGUnavailable) as caught:
        vgg16_extractor()
    line = str(caught.value)
    assert "\n" not in line and "cannot look up weights.example" in line and "offline" in line
    assert WEIGHTS_FILE in line and str(hub.parent) in line and WEIGHTS_ENV in line
    logged: list[str] = []
    # beside Inception's scores it is downloaded; it cannot be: precision and recall stay in Inception's, said once
    assert precision_recall_features(INCEPTION_NAME, "cpu", logged.append) == (None, INCEPTION_NAME)
    assert len(logged) == 1 and f"precision and recall in {INCEPTION_NAME} features, not VGG-16 fc2" in logged[0]
    assert "cannot look up" in logged[0] and not hub.exists()


def test_downloaded_once_beside_inception_and_only_looked_up_beside_others(hub, stand_in, serve, monkeypatch):
    path, _ = stand_in
    logged: list[str] = []
    assert precision_recall_features("random-conv-v1", "cpu", logged.append) == (None, "random-conv-v1")
    assert "downloads are off" in logged[0] and WEIGHTS_ENV in logged[0] and not hub.exists()
    monkeypatch.setattr(vgg, "WEIGHTS", replace(vgg.WEIGHTS, url=serve(send(path.read_bytes()))))
    extractor, space = precision_recall_features(INCEPTION_NAME, "cpu", logged.append)
    assert space == VGG_NAME and isinstance(extractor, vgg.VGG16Features) and len(logged) == 1
    assert hub.read_bytes() == path.read_bytes()  # kept in the cache, hash checked
    monkeypatch.setattr(vgg, "WEIGHTS", replace(vgg.WEIGHTS, url="http://127.0.0.1:9/unreachable"))
    assert precision_recall_features("random-conv-v1", "cpu", logged.append)[1] == VGG_NAME  # the cache, no network


class Payload:
    """Unpickling it would create a folder: a file that holds code (never unpickled here)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.mkdir, (str(self.marker),)


def test_a_corrupt_cache_and_a_file_with_code_are_one_line_and_run_nothing(hub, stand_in, tmp_path, monkeypatch):
    hub.parent.mkdir(parents=True)
    hub.write_bytes(stand_in[0].read_bytes()[:1000])  # a download cut short, left by hand
    with pytest.raises(VGGUnavailable) as caught:
        vgg16_extractor()
    line = str(caught.value)
    assert line.startswith(f"the cached VGG-16 weights {hub} are corrupt") and "\n" not in line
    assert f"delete it (rm {hub})" in line and "truncated or damaged" in line
    code = tmp_path / f"code-{WEIGHTS_FILE}"
    code.write_bytes(pickle.dumps({"features.0.weight": Payload(tmp_path / "RAN")}))
    monkeypatch.setenv(WEIGHTS_ENV, str(code))  # a file given by the user is not hashed, but loaded weights-only
    with pytest.raises(VGGUnavailable) as caught:
        vgg16_extractor()
    assert str(code) in str(caught.value) and "\n" not in str(caught.value) and not (tmp_path / "RAN").exists()


def test_training_evaluation_measures_precision_and_recall_in_vgg_features(hub, stand_in, tmp_path, monkeypatch):
    """--eval-every's evaluator with the weights in the cache: VGG-16 features of the real images as its reference,
    said in the evaluation's line (32-px input here: this is about the wiring, not the network)."""
    from gan_accel.cli.train import build_evaluator
    from gan_accel.data import open_image_data
    from test_train_cli import write_images

    monkeypatch.setattr(vgg.VGG16Features, "size", 32)
    hub.parent.mkdir(parents=True)
    hub.write_bytes(stand_in[0].read_bytes())
    write_images(tmp_path / "photos", 6)
    data = open_image_data(str(tmp_path / "photos"), resolution=16, channels=3, labels="none", log=None)
    args = argparse.Namespace(eval_features="random", eval_every=2, eval_samples=8, data=str(tmp_path / "photos"))
    logged: list[str] = []
    evaluator, space = build_evaluator(args, data, "cpu", logged.append, seed=0)
    assert space == "random-conv-v1" and evaluator.pr_features == VGG_NAME
    assert evaluator.pr_reference.shape == (6, 4096) and evaluator.metric == "fd"
    assert logged == ["gan_accel: evaluation every 2 steps: 8 samples against 6 real images in random-conv-v1 "
                      f"features (precision and recall in {VGG_NAME} features)"]
