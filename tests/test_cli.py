"""The ``gan-accel`` command: sample (png, npz, folder; EMA or raw G; seeds), info, plot, and one
``error:`` line (exit 2) for every mistake.

Each output is checked against an independent computation: the arrays against the trainer's own
generator on the same latents, the PNG files against the arrays, ``info`` against the files it
describes (``metrics.jsonl``, ``best.json``, ``eval.json``, the checkpoints and the history).

Every test here reads the shared runs ``ema_run`` and ``cond_run`` of tests/cli_runs.py (each trained once for
this module: import them into no other test file), and the in-process command from there too. ``info`` on a
resumed run and on a run in progress, ``--help``, ``--debug`` and ``sample --no-ema`` on a run without an EMA
are in tests/test_cli_info.py.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import NUM_CLASSES
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel import load_generator
from gan_accel.sampling import sample_images
from gan_accel.storage.checkpoint import list_checkpoints
from gan_accel.storage.lock import RunLock
from cli_runs import CK2, CK4, MODEL, cli, error_line, snapshot, the_same_latents
from cli_runs import cond_run, ema_run  # noqa: F401 (the fixtures: trained once for this module)

ROOT = Path(__file__).resolve().parents[1]


# -- sample ----------------------------------------------------------------------------------------
def test_sample_npz_is_the_runs_ema_on_the_seeds_latents(ema_run, tmp_path, capsys):
    run, trainer = ema_run
    code, out, _ = cli(["sample", run, "--num", 10, "--seed", 3, "--out", tmp_path / "s.npz"], capsys)
    assert code == 0 and "10 samples, the EMA of G of step 4, seed 3" in out
    arrays = np.load(tmp_path / "s.npz")
    assert set(arrays.files) == {"images"} and arrays["images"].shape == (10, 1, 28, 28)
    np.testing.assert_array_equal(arrays["images"], sample_images(load_generator(run), 10, seed=3)[0].numpy())
    # Independently: the trainer's own sampling generator (the EMA) on the same latents.
    with torch.no_grad():
        expected = copy.deepcopy(trainer.sampling_generator()).eval()(the_same_latents(10, 3))
    torch.testing.assert_close(torch.from_numpy(arrays["images"]), expected)


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_samples(ema_run, tmp_path, capsys):
    run, _ = ema_run
    for fmt in ("png", "npz"):
        paths = [tmp_path / f"{name}.{fmt}" for name in ("a", "b", "c")]
        for path, seed in zip(paths, (1, 1, 2)):
            assert cli(["sample", run, "--num", 9, "--seed", seed, "--out", path], capsys)[0] == 0
        assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()
    folders = [tmp_path / name for name in ("fa", "fb", "fc")]
    for folder, seed in zip(folders, (1, 1, 2)):
        assert cli(["sample", run, "--num", 4, "--seed", seed, "--format", "folder", "--out", folder], capsys)[0] == 0
    a, b, c = ({p.name: p.read_bytes() for p in folder.iterdir()} for folder in folders)
    assert a == b and a.keys() == c.keys() and all(a[k] != c[k] for k in a)


def test_no_ema_samples_the_raw_g_kept_in_the_last_checkpoint(ema_run, tmp_path, capsys):
    run, trainer = ema_run
    code, out, _ = cli(["sample", run, "--no-ema", "--num", 8, "--seed", 5, "--out", tmp_path / "raw.npz"], capsys)
    assert code == 0 and "the raw G of step 4" in out
    raw = np.load(tmp_path / "raw.npz")["images"]
    with torch.no_grad():  # the trainer's G itself, after its last step
        G = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.G)).eval()
        torch.testing.assert_close(torch.from_numpy(raw), G(the_same_latents(8, 5)))
    assert cli(["sample", run, "--num", 8, "--seed", 5, "--out", tmp_path / "ema.npz"], capsys)[0] == 0
    # The EMA is another G (4 steps of a tiny G: its outputs are ~1e-3, the EMA's differ by a few percent).
    assert np.abs(np.load(tmp_path / "ema.npz")["images"] - raw).max() > 0.01 * np.abs(raw).max()
    # The checkpoint of the last step gives the same raw G; an older one another.
    assert cli(["sample", run / "checkpoints" / CK4, "--no-ema", "--num", 8, "--seed", 5, "--out",
                tmp_path / "ck4.npz"], capsys)[0] == 0
    np.testing.assert_array_equal(np.load(tmp_path / "ck4.npz")["images"], raw)
    for name, ema in (("ck2_raw", False), ("ck2_ema", True)):
        argv = ["sample", run / "checkpoints" / CK2, "--num", 8, "--seed", 5, "--out", tmp_path / f"{name}.npz"]
        assert cli(argv + ([] if ema else ["--no-ema"]), capsys)[0] == 0
        G2 = load_generator(run / "checkpoints" / CK2, ema=ema)
        assert G2.info["weights"]["ema"] is ema and G2.info["weights"]["step"] == 2
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npz")["images"],
                                      sample_images(G2, 8, seed=5)[0].numpy())
    ck2_raw, ck2_ema = np.load(tmp_path / "ck2_raw.npz")["images"], np.load(tmp_path / "ck2_ema.npz")["images"]
    assert np.abs(ck2_raw - ck2_ema).max() > 0.01 * np.abs(ck2_raw).max()


def test_no_ema_when_the_last_checkpoint_is_gone_names_the_others(ema_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(ema_run[0], run)
    shutil.rmtree(run / "checkpoints" / CK4)
    line = error_line(["sample", run, "--no-ema", "--out", tmp_path / "x.png"], capsys)
    assert "holds the EMA of G only" in line and CK4 in line and f"complete ones: {CK2}" in line
    assert not (tmp_path / "x.png").exists()


def test_folder_format_one_png_per_sample_with_the_npz_pixels(ema_run, cond_run, tmp_path, capsys):
    for run, names in ((ema_run[0], [f"{i:06d}.png" for i in range(6)]),
                       (cond_run[0], [f"{i:06d}_label{y}.png" for i, y in enumerate([0, 0, 1, 1, 2, 2])])):
        folder, arrays = tmp_path / f"{run.name}_pngs", tmp_path / f"{run.name}.npz"
        assert cli(["sample", run, "--num", 6, "--seed", 4, "--format", "folder", "--out", folder], capsys)[0] == 0
        assert cli(["sample", run, "--num", 6, "--seed", 4, "--out", arrays], capsys)[0] == 0
        assert sorted(p.name for p in folder.iterdir()) == names  # nothing else (no temporary files)
        images = np.load(arrays)["images"]
        # The documented quantisation in float32, as the command computes it (in float64 a value a hair
        # from .5 can round the other way).
        expected = np.clip(np.round((images.astype(np.float32) + np.float32(1)) * np.float32(127.5)), 0, 255)
        expected = expected.astype(np.uint8)
        for name, image in zip(names, expected):
            with Image.open(folder / name) as png:
                assert png.mode == "L" and png.size == (28, 28)
                np.testing.assert_array_equal(np.asarray(png), image[0])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_conditional_sample_counts_and_labels(cond_run, tmp_path, capsys):
    run, trainer = cond_run
    assert cli(["sample", run, "--out", tmp_path / "all.npz"], capsys)[0] == 0  # default: 8 per class
    arrays = np.load(tmp_path / "all.npz")
    assert arrays["labels"].tolist() == [c for c in range(NUM_CLASSES) for _ in range(8)]
    with torch.no_grad():
        expected = copy.deepcopy(trainer.sampling_generator()).eval()(the_same_latents(24, 0),
                                                                       torch.from_numpy(arrays["labels"]))
    torch.testing.assert_close(torch.from_numpy(arrays["images"]), expected)
    assert cli(["sample", run, "--label", 1, "--num", 7, "--out", tmp_path / "ones.npz"], capsys)[0] == 0
    assert np.load(tmp_path / "ones.npz")["labels"].tolist() == [1] * 7
    assert error_line(["sample", run, "--num", 7, "--out", tmp_path / "x.npz"], capsys) == (
        "error: --num 7 is not a multiple of the run's 3 classes (the samples are shared equally between them): "
        "pass --num 6 or 9, or --label to sample one class")
    assert "pass --num 3, or --label" in error_line(["sample", run, "--num", 2, "--out", tmp_path / "x.npz"], capsys)
    grid = tmp_path / "grid.png"
    assert cli(["sample", run, "--num", 6, "--out", grid], capsys)[0] == 0
    with Image.open(grid) as image:  # one row per class, 2 columns
        assert image.size == (2 * (28 + 2) + 2, NUM_CLASSES * (28 + 2) + 2)


# -- one line per mistake --------------------------------------------------------------------------
def test_interpolate_writes_the_walks_grid_and_gif_of_the_runs_g(ema_run, cond_run, tmp_path, capsys):
    from gan_accel.pictures.grids import png_grid
    from gan_accel.sampling import interpolate

    run = ema_run[0]
    code, out, err = cli(["sample", run, "--interpolate", "--walks", 3, "--steps", 4, "--seed", 5,
                          "--out", tmp_path / "w.png", "--gif", tmp_path / "w.gif"], capsys)
    assert code == 0, err
    assert "3 walks x 4 steps of slerp, the EMA of G of step 4, seed 5" in out and "4 frames" in out
    G = load_generator(run)
    images = interpolate(G, 3, 4, seed=5)
    assert (tmp_path / "w.png").read_bytes() == png_grid(images, 4)  # the Python API's walks, a row each
    with Image.open(tmp_path / "w.png") as grid:
        assert grid.size == (4 * 30 + 2, 3 * 30 + 2)
    with Image.open(tmp_path / "w.gif") as gif:
        assert gif.n_frames == 4 and gif.size == (2 * 30 + 2, 2 * 30 + 2)  # 3 walks in a 2-column grid
        gif.seek(3)
        last = np.asarray(gif.convert("L"), dtype=np.int16)
    with Image.open(io.BytesIO(png_grid(images.reshape(3, 4, *images.shape[1:])[:, 3], None))) as expected:
        assert np.abs(last - np.asarray(expected.convert("L"), dtype=np.int16)).max() <= 1  # frame j: step j
    # a conditional run: one walk per class by default, or every walk in the --label class
    cond = cond_run[0]
    for extra, rows in (([], NUM_CLASSES), (["--label", "1", "--walks", 2], 2)):
        code, out, err = cli(["sample", cond, "--interpolate", "--steps", 3, *extra, "--out", tmp_path / f"c{rows}.png"],
                             capsys)
        assert code == 0, err
        with Image.open(tmp_path / f"c{rows}.png") as grid:
            assert grid.size == (3 * 30 + 2, rows * 30 + 2)
    assert "class 1" in out


def _prepare(case: str, tmp: Path, ema: Path, cond: Path) -> list:
    """The arguments of one mistake; files it needs are made under ``tmp``."""
    out = tmp / "out.png"
    if case in ("no-export", "no-export-no-checkpoint", "no-weights", "no-engine-state", "partial", "tmp-checkpoint"):
        run = tmp / "run"
        shutil.copytree(ema, run)
        shutil.rmtree(run / "generator")
        if case == "no-export":
            return ["sample", run, "--out", out]
        if case == "no-export-no-checkpoint":
            shutil.rmtree(run / "checkpoints")
            return ["sample", run, "--out", out]
        checkpoint = run / "checkpoints" / CK2
        if case == "no-weights":
            (checkpoint / "model.safetensors").unlink()
            return ["sample", checkpoint, "--no-ema", "--out", out]
        if case == "no-engine-state":
            (checkpoint / "gan_accel_state_0.safetensors").unlink()
            return ["sample", checkpoint, "--out", out]
        if case == "partial":
            (checkpoint / "COMPLETE").unlink()
            return ["sample", checkpoint, "--out", out]
        return ["sample", checkpoint.rename(checkpoint.with_name(".tmp-" + CK2)), "--out", out]
    if case == "not-a-run":
        (tmp / "photos").mkdir()
        return ["sample", tmp / "photos", "--out", out]
    if case == "existing-out":
        out.write_bytes(b"mine")
        return ["sample", ema, "--out", out]
    if case == "walks-existing-out":
        out.write_bytes(b"mine")
        return ["sample", ema, "--interpolate", "--out", out, "--gif", tmp / "walks.gif"]
    if case == "walks-existing-gif":
        (tmp / "walks.gif").write_bytes(b"mine")
        return ["sample", ema, "--interpolate", "--out", out, "--gif", tmp / "walks.gif"]
    if case == "existing-folder":
        (tmp / "pngs").mkdir()
        return ["sample", ema, "--format", "folder", "--out", tmp / "pngs"]
    if case == "out-under-a-file":
        (tmp / "file").write_text("x")
        return ["sample", ema, "--out", tmp / "file" / "x.png"]
    if case == "info-not-a-run":
        (tmp / "photos").mkdir()
        return ["info", tmp / "photos"]
    if case == "plot-no-metrics":
        run = tmp / "run"
        run.mkdir()
        (run / "config.json").write_text("{}")
        return ["plot", run]
    if case == "plot-existing-out":
        out.write_bytes(b"mine")
        return ["plot", ema, "--out", out]
    if case == "eval-existing-out":
        (tmp / "scores.json").write_text("{}")
        return ["eval", ema, "--out", tmp / "scores.json"]
    return {
        "missing": ["sample", tmp / "nowhere", "--out", out],
        "walks-without-interpolate": ["sample", ema, "--walks", "3", "--out", out],
        "walks-with-num": ["sample", ema, "--interpolate", "--num", "3", "--out", out],
        "walks-npz": ["sample", ema, "--interpolate", "--out", tmp / "w.npz"],
        "walks-gif-ending": ["sample", ema, "--interpolate", "--out", out, "--gif", tmp / "w.png"],
        "walks-same-files": ["sample", ema, "--interpolate", "--format", "png", "--out", tmp / "w.gif", "--gif",
                             tmp / "w.gif"],
        "walks-too-many": ["sample", ema, "--interpolate", "--walks", "101", "--out", out],
        "walks-one-step": ["sample", ema, "--interpolate", "--steps", "1", "--out", out],
        "walks-label-unconditional": ["sample", ema, "--interpolate", "--label", "1", "--out", out],
        "a-file": ["sample", ema / "config.json", "--out", out],
        "checkpoints-folder": ["sample", ema / "checkpoints", "--out", out],
        "label-unconditional": ["sample", ema, "--label", 1, "--out", out],
        "label-out-of-range": ["sample", cond, "--label", 7, "--out", out],
        "label-negative": ["sample", cond, "--label", -1, "--out", out],
        "missing-out-folder": ["sample", ema, "--out", tmp / "nowhere" / "x.png"],
        "out-named-like-the-runs": ["sample", ema, "--out", ema / "samples_000003.png"],
        "bad-format": ["sample", ema, "--format", "jpg", "--out", out],
        "unknown-ending": ["sample", ema, "--out", tmp / "samples"],
        "format-contradicts-ending": ["sample", ema, "--format", "npz", "--out", out],
        "no-out": ["sample", ema],
        "bad-num": ["sample", ema, "--num", 0, "--out", out],
        "bad-seed": ["sample", ema, "--seed", "x", "--out", out],
        "info-checkpoint": ["info", ema / "checkpoints" / CK2],
        "info-missing": ["info", tmp / "nowhere"],
        "plot-checkpoint": ["plot", ema / "checkpoints" / CK2],
        "plot-not-png": ["plot", ema, "--out", tmp / "plot.jpg"],
        "unknown-command": ["smaple", ema],
        "no-command": [],
    }[case]


@pytest.mark.parametrize("case, says", [
    ("missing", "nowhere does not exist: pass a run folder (the --output-dir of a training run) or one of its "
                "checkpoints/checkpoint_<step> folders"),
    ("a-file", "config.json is a file, not a run folder or a checkpoint folder: pass the folder that holds it"),
    ("not-a-run", "photos is not a gan_accel run folder (it has none of config.json, history.jsonl"),
    ("checkpoints-folder", "is the folder of a run's checkpoints: pass the run folder"),
    ("partial", f"{CK2} is not a complete checkpoint (no COMPLETE marker: still being written, or cut short by a "
                f"crash): pass a complete one"),
    ("tmp-checkpoint", "is not a complete checkpoint"),
    ("no-export", "has no generator/ yet (written when training ends; its latest checkpoint is at step 4): "
                  "pass that checkpoint"),
    ("no-export-no-checkpoint", "has no generator/ (written when training ends) and no complete checkpoint "
                                "yet: there is nothing to sample"),
    ("no-weights", "holds no weights of G (model.safetensors is missing)"),
    ("no-engine-state", "has no gan_accel_state_0.safetensors (the engine state"),
    ("label-unconditional", "this run is unconditional (no num_classes): it cannot sample a chosen class"),
    ("label-out-of-range", "label 7 is outside the run's classes 0..2"),
    ("label-negative", "argument --label: '-1' is not a whole number >= 0"),
    ("existing-out", "out.png: that file exists, and gan-accel never replaces anything; choose a new path"),
    ("existing-folder", "pngs: that folder exists, and gan-accel never replaces anything"),
    ("missing-out-folder", "nowhere does not exist; create it first, or choose another path"),
    ("out-under-a-file", "file is not a folder; choose another path"),
    ("out-named-like-the-runs", "samples_000003.png: that name is one of the run's own in its folder"),
    ("walks-existing-out", "out.png: that file exists, and gan-accel never replaces anything"),
    ("walks-existing-gif", "walks.gif: that file exists, and gan-accel never replaces anything"),
    ("walks-without-interpolate", "--walks is an option of latent walks: add --interpolate"),
    ("walks-with-num", "--num counts plain samples: with --interpolate the grid holds --walks x --steps images"),
    ("walks-npz", "--interpolate writes a PNG grid, not npz: end --out in .png"),
    ("walks-gif-ending", "the animation is a GIF; give a path ending in .gif"),
    ("walks-same-files", "w.gif: give the grid and the GIF a file each"),
    ("walks-too-many", "argument --walks: '101' is more than 100, the largest allowed"),
    ("walks-one-step", "argument --steps: '1' is not a whole number >= 2"),
    ("walks-label-unconditional", "this run is unconditional (no num_classes): it cannot sample a chosen class"),
    ("bad-format", "argument --format: invalid choice: 'jpg' (choose from"),
    ("unknown-ending", "cannot tell the format from its ending; end it in .png (a grid) or .npz (arrays), or pass "
                       "--format png|npz|folder"),
    ("format-contradicts-ending", "ends in .png but --format is npz: make them agree (e.g. --out"),
    ("no-out", "the following arguments are required: --out"),
    ("bad-num", "argument --num: '0' is not a whole number >= 1"),
    ("bad-seed", "argument --seed: 'x' is not a whole number >= 0"),
    ("info-checkpoint", f"{CK2} is a checkpoint: gan-accel info takes its run folder"),
    ("info-not-a-run", "is not a gan_accel run folder"),
    ("info-missing", "nowhere does not exist: pass a run folder"),
    ("plot-no-metrics", "metrics.jsonl does not exist: plot a run folder"),
    ("plot-existing-out", "that file exists"),
    ("plot-checkpoint", "is a checkpoint: gan-accel plot takes its run folder"),
    ("plot-not-png", "the plot is a PNG; give a path ending in .png"),
    ("eval-existing-out", "scores.json: that file exists"),
    ("unknown-command", "argument COMMAND: invalid choice: 'smaple'"),
    ("no-command", "the following arguments are required: COMMAND"),
])
def test_every_mistake_is_one_line_naming_the_fix(case, says, ema_run, cond_run, tmp_path, capsys):
    if case.startswith("plot-no-metrics"):
        pytest.importorskip("gan_accel.pictures.training_plot")
    tmp = tmp_path / "t"
    tmp.mkdir()
    argv = _prepare(case, tmp, ema_run[0], cond_run[0])
    before = snapshot(tmp)
    line = error_line(argv, capsys)
    assert says in line, line
    assert snapshot(tmp) == before  # nothing written, nothing replaced
    if case in ("existing-out", "walks-existing-out"):
        assert (tmp / "out.png").read_bytes() == b"mine"


@pytest.mark.parametrize("fmt", ["png", "folder"])
def test_an_unwritable_out_is_one_line(fmt, ema_run, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # root writes into read-only folders, but not into sysfs
        if not Path("/sys/kernel").is_dir():
            pytest.skip("root, and no /sys to refuse a write")
        locked = Path("/sys")
    out = locked / ("gan_accel_cli_test.png" if fmt == "png" else "gan_accel_cli_test")
    try:
        line = error_line(["sample", ema_run[0], "--format", fmt, "--num", 2, "--out", out], capsys)
    finally:
        (tmp_path / "locked").chmod(0o700)
    assert f"--out {out}" in line and "choose" in line
    assert "Permission denied (EACCES)" in line or "Operation not permitted (EPERM)" in line  # sysfs: mkdir is EPERM
    assert not out.exists()


# -- info ------------------------------------------------------------------------------------------
def test_info_reports_what_the_run_folder_holds(ema_run, capsys):
    run, _ = ema_run
    code, out, _ = cli(["info", run, "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    rows = read_metrics(run / "metrics.jsonl")
    assert report["last_metrics"] == rows[-1] and report["metrics_rows"] == len(rows)
    assert report["steps"] == {"done": rows[-1]["step"], "max_steps": 4, "last_metrics_row": 4, "latest_checkpoint": 4,
                               "exported": 4}
    assert [c["name"] for c in report["checkpoints"]] == [p.name for p in list_checkpoints(run)]
    assert report["best"] == json.loads((run / "best.json").read_text())
    assert report["eval"] == json.loads((run / "eval.json").read_text())
    assert report["status"]["state"] == "finished"
    assert [e["event"] for e in report["history"]] == ["start"]
    assert report["config"]["ema_decay"] == 0.5 and report["config"]["model"] == MODEL
    assert report["export"] == {"path": str(run / "generator"), "step": 4, "ema": True}
    code, text, _ = cli(["info", run], capsys)
    lines = text.splitlines()
    assert code == 0 and lines[0] == f"run {run}: finished"
    assert "steps: 4 / 4 (last metrics row 4, latest checkpoint 4, exported 4)" in lines
    last = next(line for line in lines if line.startswith("last metrics"))
    assert last.startswith(f"last metrics (step 4, row {len(rows)}): ") and f"loss/D={rows[-1]['loss/D']:.4g}" in last
    assert f"eval/fd={rows[-1]['eval/fd']:.4g}" in last  # a distance logged under the name older runs used too
    best = json.loads((run / "best.json").read_text())
    best_name = Path(best["checkpoint"]).name
    assert f"best: fd {best['value']:.4g} at step {best['step']}, {best_name}" in lines
    assert f"{best_name} (best)" in next(line for line in lines if line.startswith("checkpoints: "))
    assert "    Frechet distance: 12.500" in lines and "weights: generator/ (the EMA of G, step 4)" in lines
    assert "model: dcgan, width 4, 28x28x1, data test-noise" in lines


def test_info_on_a_killed_run_and_a_row_cut_short(ema_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(ema_run[0], run)
    shutil.rmtree(run / "generator")
    shutil.rmtree(run / "checkpoints" / CK4)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holder = {"host": os.uname().nodename, "pid": gone.pid, "since": "2026-01-01 00:00:00"}
    (run / ".lock").write_text(json.dumps(holder))  # what a SIGKILLed run leaves
    with open(run / "metrics.jsonl", "a") as log:
        log.write('{"step": 5, "loss/D": 0.')
    before = snapshot(run)
    code, out, _ = cli(["info", run], capsys)
    assert code == 0 and snapshot(run) == before
    assert out.splitlines()[0] == (f"run {run}: stopped at step 4 of 4 (its process, pid {gone.pid}, ended without "
                                   "finishing: killed or crashed); continue it with --resume latest")
    assert "note: metrics.jsonl: 1 unreadable row(s) skipped (a row cut short by a crash?)" in out
    assert "steps: 4 / 4 (last metrics row 4, latest checkpoint 2)" in out
    # A log with no whole row is not a crash's cut-off line: it is named as damaged.
    saved = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(b"\x00garbage\n[1, 2]\nnot json\n")
    out = cli(["info", run], capsys)[1]
    assert "metrics.jsonl: none of its 3 line(s) is a metrics row: it is damaged or not gan_accel's log" in out
    assert "cut short by a crash" not in out
    (run / "metrics.jsonl").write_bytes(saved)
    # A lock held now is reported as a run in progress.
    with RunLock(run):
        assert cli(["info", run], capsys)[1].splitlines()[0].startswith(f"run {run}: in progress: pid {os.getpid()}")


# -- plot ------------------------------------------------------------------------------------------
def test_plot_writes_the_runs_picture_and_never_replaces_an_out(ema_run, tmp_path, capsys):
    pytest.importorskip("gan_accel.pictures.training_plot")
    run = tmp_path / "run"
    shutil.copytree(ema_run[0], run)
    code, out, _ = cli(["plot", run], capsys)
    assert code == 0 and out.strip() == f"wrote {run / 'training_plot.png'}"
    assert cli(["plot", run, "--out", tmp_path / "p.png"], capsys)[0] == 0
    assert (tmp_path / "p.png").read_bytes() == (run / "training_plot.png").read_bytes()
    with Image.open(io.BytesIO((tmp_path / "p.png").read_bytes())) as image:
        assert image.format == "PNG"
    from gan_accel.pictures.training_plot import plot_run  # the picture is plot_run's, as the run draws it

    assert plot_run(run, out=tmp_path / "direct.png").read_bytes() == (tmp_path / "p.png").read_bytes()


# -- the installed command -------------------------------------------------------------------------
def test_the_command_runs_as_a_module(ema_run):
    """``python -m gan_accel.cli``: a run's summary (exit 0), a mistake in one line (exit 2), and into a pipe whose
    reader has gone (``gan-accel info RUN | head -1`` when head stops early) SIGPIPE's 141 without an error line.
    The three processes run at once: each mostly imports torch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def info(path, **kwargs) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "gan_accel.cli", "info", str(path)], stderr=subprocess.PIPE,
                                text=True, env=env, cwd=ROOT, **kwargs)

    ok, wrong, reader_gone = (info(ema_run[0], stdout=subprocess.PIPE),
                              info(ema_run[0] / "nowhere", stdout=subprocess.PIPE), info(ema_run[0], stdout=subprocess.PIPE))
    reader_gone.stdout.close()  # before its first byte
    out, err = ok.communicate(timeout=120)
    assert ok.returncode == 0 and out.startswith(f"run {ema_run[0]}: finished"), err
    out, err = wrong.communicate(timeout=120)
    assert wrong.returncode == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert reader_gone.wait(timeout=120) == 141 and reader_gone.stderr.read() == ""
