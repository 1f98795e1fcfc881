"""``gan-accel eval RUN --data PATH``: a run scored against a folder of the user's own images, the real
images' features cached per dataset, resolution and feature space."""

from __future__ import annotations

import json

import pytest
import torch

from gan_accel.data import open_image_data
from gan_accel.eval import frechet_distance_from_features, precision_recall
from gan_accel.eval.random_features import NAME, RandomConvFeatures
from gan_accel import load_generator
from gan_accel.sampling import sample_images
from gan_accel.eval.vgg import VGG_NAME
from test_train_cli import error_line, gan_accel, rgb_run, write_images  # noqa: F401  (rgb_run: a fixture)
from test_vgg import hub, stand_in  # noqa: F401  (fixtures: stand-in VGG-16 weights in torch hub's cache)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def independent_scores(run, photos, num: int) -> tuple[float, float, float]:
    """FD, precision and recall computed here: the training loader's images (not eval's own reader) and
    sample_images' samples of the same seed, in the random network's features."""
    images, _ = sample_images(load_generator(run), num, seed=0)
    data = open_image_data(str(photos), resolution=images.shape[-1], channels=images.shape[1], labels="none", log=None)
    batches = data.dataloader(16, shuffle=False, drop_last=False)
    real = torch.cat([b if isinstance(b, torch.Tensor) else b[0] for b in batches])
    extractor = RandomConvFeatures()
    fake_f, real_f = extractor(images), extractor(real)
    precision, recall = precision_recall(fake_f, real_f, 3)
    return frechet_distance_from_features(fake_f, real_f), precision, recall


def test_scores_against_a_folder_equal_an_independent_computation_and_reuse_the_real_features(rgb_run, tmp_path,
                                                                                                capsys):
    root, run = rgb_run
    photos = root / "photos"
    argv = ["eval", run, "--data", photos, "--features", "random", "--num", 40]
    code, out, err = gan_accel([*argv, "--out", tmp_path / "first.json"], capsys)
    assert code == 0, err[-2000:]
    first = json.loads((tmp_path / "first.json").read_text())
    assert "real features from the cache" not in out and first["real_images"] == 40 and first["samples"] == 40
    fd, precision, recall = independent_scores(run, photos, 40)
    assert first["fd"] == pytest.approx(fd, rel=1e-4)
    # without VGG-16's weights precision and recall are in the same features, and every place says so
    assert (first[f"precision_{NAME}"], first[f"recall_{NAME}"]) == pytest.approx((precision, recall))
    assert first["pr_features"] == NAME and f"k = 3, in {NAME} features" in out
    assert f"precision and recall in {NAME} features, not VGG-16 fc2" in out
    cached = list((tmp_path / "cache" / "features").glob("*.safetensors"))
    assert len(cached) == 1

    code, out, _ = gan_accel([*argv, "--out", tmp_path / "second.json"], capsys)
    assert code == 0 and "real features from the cache" in out
    assert json.loads((tmp_path / "second.json").read_text())["fd"] == first["fd"]

    # A damaged cache file is computed again, not trusted and not a crash.
    cached[0].write_bytes(b"not safetensors")
    code, out, _ = gan_accel([*argv, "--out", tmp_path / "third.json"], capsys)
    assert code == 0 and "real features from the cache" not in out
    assert json.loads((tmp_path / "third.json").read_text())["fd"] == pytest.approx(first["fd"], rel=1e-6)


def test_with_vgg_weights_precision_and_recall_are_in_its_features_and_say_so(rgb_run, hub, stand_in, tmp_path,
                                                                             monkeypatch, capsys):
    """The stand-in VGG-16 weights in the cache (32-px input: this is about the wiring): the printed line, the JSON
    and the names say vgg16-fc2; the distance stays in the random network's features."""
    import gan_accel.eval.vgg as vgg

    monkeypatch.setattr(vgg.VGG16Features, "size", 32)
    hub.parent.mkdir(parents=True)
    hub.write_bytes(stand_in[0].read_bytes())
    root, run = rgb_run
    code, out, err = gan_accel(["eval", run, "--data", root / "photos", "--features", "random", "--num", 8, "--out",
                                tmp_path / "scores.json"], capsys)
    assert code == 0, err[-2000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["features"] == NAME and scores["pr_features"] == VGG_NAME and "fd" in scores
    assert {f"precision_{VGG_NAME}", f"recall_{VGG_NAME}"} <= set(scores) and "precision" not in scores
    assert f"k = 3, in {VGG_NAME} features" in out and "not VGG-16" not in out


def test_a_changed_folder_is_not_scored_with_old_features(rgb_run, tmp_path, capsys):
    root, run = rgb_run
    photos = tmp_path / "photos"
    write_images(photos, 40)
    argv = ["eval", run, "--data", photos, "--features", "random", "--num", 20]
    assert gan_accel(argv, capsys)[0] == 0
    write_images(photos / "more", 3, seed=5)
    code, out, _ = gan_accel([*argv, "--out", tmp_path / "after.json"], capsys)
    assert code == 0 and "real features from the cache" not in out
    assert json.loads((tmp_path / "after.json").read_text())["real_images"] == 43
    assert len(list((tmp_path / "cache" / "features").glob("*.safetensors"))) == 2


@pytest.mark.parametrize("case", ["missing", "empty", "seed"])
def test_bad_eval_data_is_one_line(rgb_run, tmp_path, capsys, case):
    _, run = rgb_run
    (tmp_path / "empty").mkdir()
    argv = {"missing": ["eval", run, "--data", tmp_path / "nowhere"],
            "empty": ["eval", run, "--data", tmp_path / "empty"],
            "seed": ["eval", run, "--data", tmp_path / "empty", "--seed", str(2 ** 70)]}[case]
    line = error_line(argv, capsys)
    assert {"missing": "nowhere", "empty": "empty", "seed": "seed"}[case] in line
