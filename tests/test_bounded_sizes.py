"""Sizes from the user or from a file are bounded before memory is used, and file contents print safely.

``sample`` and ``eval`` make (and ``sample`` writes) their samples a chunk at a time: memory does not
grow with ``--num``, which has a hard bound said in one line; a PNG grid, made in memory, has its
own. A file's recorded model spec is checked against sane bounds and against the shapes of the
weights it describes (read from the file's header, the model built on the meta device) before any
generator is built. ``info`` shows a terminal's control characters from the run's files as escapes.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from conftest import NUM_CLASSES
from gan_accel import CheckpointError, load_generator
from gan_accel.errors import ConfigError
from gan_accel.sampling import MAX_SAMPLES, iter_samples, sample_images
from cli_runs import Z, cli, error_line, snapshot, train


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    train(root / "plain", steps=2, ema=None)
    train(root / "cond", steps=2, ema=None, conditional=True)
    return root / "plain", root / "cond"


# -- sample: bounded, chunked, the same numbers ------------------------------------------------------------
@pytest.mark.parametrize("num", [1, 2, 17, 512, 513, 1100])
def test_chunked_samples_are_those_of_one_draw_of_all_the_latents(runs, num):
    """The latents are drawn a chunk at a time: the same numbers as one torch.randn(num, z_dim) (the
    independent computation), so --seed means what it meant, whatever --num."""
    for run in runs:
        G = load_generator(run)
        count = num if getattr(G, "num_classes", None) is None else num * NUM_CLASSES
        images, labels = sample_images(G, count, seed=3)
        z = torch.randn(count, Z, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            expected = G(z) if labels is None else G(z, torch.arange(NUM_CLASSES).repeat_interleave(num))
        torch.testing.assert_close(images, expected)
        if labels is not None:
            assert labels.tolist() == [c for c in range(NUM_CLASSES) for _ in range(num)]


def test_g_never_sees_more_than_a_chunk_and_the_npz_and_folder_hold_every_sample(runs, tmp_path, capsys, monkeypatch):
    import gan_accel.sampling as sampling

    monkeypatch.setattr(sampling, "CHUNK", 64)  # many chunks in a small test
    run, cond = runs
    G = load_generator(run)
    seen = []
    original = type(G).forward
    monkeypatch.setattr(type(G), "forward", lambda self, z, *a: seen.append(len(z)) or original(self, z, *a))
    assert cli(["sample", run, "--num", 1000, "--seed", 2, "--out", tmp_path / "a.npz"], capsys)[0] == 0
    assert max(seen) <= 64 + 1 and sum(seen) == 1000  # (a tail under 16 numbers joins its chunk)
    arrays = np.load(tmp_path / "a.npz")
    assert set(arrays.files) == {"images"} and arrays["images"].shape == (1000, 1, 28, 28)
    np.testing.assert_array_equal(arrays["images"], sample_images(G, 1000, seed=2)[0].numpy())
    # An .npz as np.savez writes it (the independent writer), array for array.
    images, _ = sample_images(G, 1000, seed=2)
    np.savez(tmp_path / "ref.npz", images=images.numpy())
    np.testing.assert_array_equal(np.load(tmp_path / "ref.npz")["images"], arrays["images"])
    # A conditional run: the labels too, and the folder's files, one per sample, in order.
    assert cli(["sample", cond, "--num", 300, "--out", tmp_path / "c.npz"], capsys)[0] == 0
    assert cli(["sample", cond, "--num", 300, "--format", "folder", "--out", tmp_path / "pngs"], capsys)[0] == 0
    labels = np.load(tmp_path / "c.npz")["labels"]
    assert labels.tolist() == [c for c in range(NUM_CLASSES) for _ in range(100)]
    names = sorted(p.name for p in (tmp_path / "pngs").iterdir())
    assert names == [f"{i:06d}_label{y}.png" for i, y in enumerate(labels)]


def test_too_many_samples_are_one_line_before_any_work(runs, tmp_path, capsys):
    run = runs[0]
    line = error_line(["sample", run, "--num", MAX_SAMPLES + 1, "--out", tmp_path / "x.npz"], capsys)
    assert f"is more than {MAX_SAMPLES:,}, the largest allowed" in line
    # A PNG grid is drawn in memory: at most 10,000 samples; folder and npz stream any --num.
    line = error_line(["sample", run, "--num", 10_001, "--out", tmp_path / "grid.png"], capsys)
    assert "a PNG grid of 10,001 samples is drawn in memory and holds at most 10,000 samples" in line
    assert "use --format folder" in line
    assert not list(tmp_path.iterdir())
    with pytest.raises(ConfigError, match="ask for 1 to 10,000,000 at a time"):
        next(iter_samples(load_generator(run), MAX_SAMPLES + 1))
    line = error_line(["eval", run, "--num", 50_001], capsys)
    assert "is more than 50,000, the largest allowed (precision and recall compare every pair)" in line


# -- what a file may ask for ----------------------------------------------------------------------------------
def exported_with(run, tmp_path, **model_changes):
    """A copy of ``run`` whose generator/config.json records a changed model spec (the same weights)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = json.loads((copy / "generator" / "config.json").read_text())
    config["model"] = {**config["model"], **model_changes}
    (copy / "generator" / "config.json").write_text(json.dumps(config))
    return copy


def built_on(monkeypatch) -> list[str]:
    """The default device at each generator build of load_generator (meta: sizes only, nothing allocated)."""
    import gan_accel.hub.load as load

    devices, build = [], load.build_generator
    monkeypatch.setattr(load, "build_generator",
                        lambda spec: devices.append(str(torch.get_default_device())) or build(spec))
    return devices


@pytest.mark.parametrize("change, says", [
    ({"width": 10**9}, "records a model spec with width=1000000000, beyond what gan_accel builds (at most 8,192)"),
    ({"z_dim": 10**7}, "records a model spec with z_dim=10000000, beyond what gan_accel builds (at most 65,536)"),
    ({"width": 2048}, "the weights do not fit the model its recorded spec describes (net.0.weight: (8, 8, 7, 7) in "
                      "the file, (8, 4096, 7, 7) in the spec"),  # z_dim 8 in, 2 x width out
    ({"channels": 3}, "the weights do not fit the model its recorded spec describes"),
])
def test_a_spec_asking_for_a_huge_or_another_model_is_refused_before_building_it(runs, tmp_path, capsys,
                                                                                  monkeypatch, change, says):
    copy = exported_with(runs[0], tmp_path, **change)
    devices = built_on(monkeypatch)
    line = error_line(["sample", copy, "--num", 4, "--out", tmp_path / "x.npz"], capsys)
    assert says in line, line
    assert all(device == "meta" for device in devices)  # nothing was built for real
    assert not (tmp_path / "x.npz").exists()


def test_the_checkpoint_weights_are_checked_as_well(runs, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    checkpoint = sorted((run / "checkpoints").iterdir())[-1]
    marker = json.loads((checkpoint / "COMPLETE").read_text())
    marker["config"]["model"] = {**marker["config"]["model"], "width": 2048}
    (checkpoint / "COMPLETE").write_text(json.dumps(marker))
    devices = built_on(monkeypatch)
    with pytest.raises(CheckpointError, match="the weights do not fit the model its recorded spec describes"):
        load_generator(checkpoint)
    assert devices == ["meta"]


@pytest.mark.parametrize("text, says", [
    ("[1, 2]", "is not a gan_accel generator's config (no \"format\": \"gan_accel.generator\")"),
    ('{"format": "gan_accel.generator", "format_version": 1, "weights": 3}', "names the weights '3': gan_accel reads only model.safetensors"),
    ('{"format": "gan_accel.generator", "format_version": 1, "weights": {}, "model": [1]}', "records no model spec"),
    ("{" * 100_000, "is not valid JSON"),
])
def test_a_config_that_is_not_of_the_format_is_one_line(runs, tmp_path, capsys, text, says):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    (run / "generator" / "config.json").write_text(text)
    line = error_line(["sample", run, "--out", tmp_path / "x.npz"], capsys)
    assert says in line, line


# -- info prints file contents safely -------------------------------------------------------------------------
def test_info_shows_control_characters_as_escapes(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    config = json.loads((run / "config.json").read_text())
    config["loss"] = "\x1b[2J\x1b[31mhinge"  # clear the screen, then red
    config["extra"]["dataset"] = "mnist\nnote: all good"  # a forged line
    (run / "config.json").write_text(json.dumps(config))
    with open(run / "metrics.jsonl", "a") as log:
        log.write(json.dumps({"step": 3, "loss/D": "\x07bell"}) + "\n[1, 2]\n")
    with open(run / "history.jsonl", "a") as history:
        history.write('"not an object"\n')
    code, out, err = cli(["info", run], capsys)
    assert code == 0 and not err
    assert "\x1b" not in out and "\x07" not in out
    assert "loss \\x1b[2J\\x1b[31mhinge" in out and "data mnist\\nnote: all good" in out
    assert not any(line.startswith("note: all good") for line in out.splitlines())
    assert "note: metrics.jsonl: 1 unreadable row(s) skipped" in out and "history.jsonl: an unreadable line" in out
    code, out, _ = cli(["info", run, "--json"], capsys)  # JSON escapes them itself
    assert code == 0 and "\x1b" not in out and json.loads(out)["config"]["loss"] == config["loss"]


def test_a_checkpoint_marker_that_is_not_an_object_is_no_crash(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    checkpoint = sorted((run / "checkpoints").iterdir())[-1]
    (checkpoint / "COMPLETE").write_text("[1, 2]")
    before = snapshot(run)
    code, out, err = cli(["info", run], capsys)
    assert code == 0 and not err and snapshot(run) == before
