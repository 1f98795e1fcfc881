"""A run folder's config and bounds: a run's history is its config (fixed fields refused on resume with every
difference, changeable ones such as the learning rate applied for real, a longer run's schedule jump said),
every process of a launched run agrees on an error and none hangs, and the bounds on sample grids and their
GIF (evenly spaced frames, ``keep_samples`` pruning, validation, memory).

Checked against what is on disk before and after, or the optimizer against an independent update. The run
helpers (``trainer_for``, ``tree``, ...) come from tests/test_run_folder.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import params
from gan_accel import CheckpointError, TrainConfig
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.callbacks.sample_saver import gif_steps, scheduled_gif_steps, stamped_samples
from gan_accel.config import compare_configs
from gan_accel.errors import ConfigError
from gan_accel.storage.lock import RunLock
from gan_accel.storage.run_folder import read_history
from test_run_folder import ROOT, trainer_for, tree


# -- a run's history is its config -------------------------------------------------------------------
def test_fixed_fields_are_refused_with_every_difference_before_anything_is_loaded(tmp_path):
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=4)
    before = tree(out)
    with pytest.raises(CheckpointError, match=r"batch_size: 4 -> 2; loss: 'nonsaturating' -> 'hinge'"):
        trainer_for(out, batch_size=2, loss="hinge").fit(resume_from="latest")
    with pytest.raises(CheckpointError, match=r"r1_gamma: None -> 1.0"):  # switching a penalty on adds a phase
        trainer_for(out, r1_gamma=1.0).fit(resume_from="latest")
    assert {n: d for n, d in tree(out).items() if n != ".lock"} == {n: d for n, d in before.items() if n != ".lock"}


def test_compare_configs_sorts_every_field_into_fixed_or_changeable():
    saved = TrainConfig(model={"width": 8}, extra={"note": "a"}).to_dict()
    refused, changed = compare_configs(saved, TrainConfig(lr_G=1e-3, r1_gamma=None, max_steps=9, model={"width": 16},
                                                          extra={"note": "b"}, output_dir="elsewhere", z_dim=7).to_dict())
    assert refused == ["model: {'width': 8} -> {'width': 16}", "z_dim: 100 -> 7"]
    assert changed == {"lr_G": [2e-4, 1e-3], "max_steps": [2000, 9], "extra.note": ["a", "b"]}
    # tuples from a live config equal the lists of one read back from JSON
    assert compare_configs(json.loads(json.dumps(saved)), saved) == ([], {})



def test_a_changed_learning_rate_on_resume_really_changes_the_update(tmp_path):
    """Adam's update is linear in the rate: from one checkpoint, one step with G's rate doubled moves
    every weight of G exactly twice as far (D, updated first, is unchanged, so G's gradients and
    moments are the same). The rate is also logged and dated."""
    out = tmp_path / "run"
    first = trainer_for(out, lr_schedule="constant", warmup_ratio=0.0, max_steps=4)
    first.fit()
    before = {"G": params(first.G), "D": params(first.D)}  # the weights in checkpoint 4
    moves = {}
    for factor in (1, 2):  # each a fork of checkpoint 4 into its own folder
        fork = tmp_path / f"x{factor}"
        resumed = trainer_for(fork, lr_schedule="constant", warmup_ratio=0.0, max_steps=5, lr_G=2e-4 * factor)
        resumed.fit(resume_from=out / "checkpoints" / "checkpoint_00000004")
        moves[factor] = {net: {k: params(getattr(resumed, net))[k] - v for k, v in before[net].items()}
                         for net in ("G", "D")}
        assert resumed.opt_G.param_groups[0]["lr"] == 2e-4 * factor
        assert read_metrics(fork / "metrics.jsonl")[-1]["lr/G"] == 2e-4 * factor
    for key, move in moves[1]["G"].items():
        assert move.abs().max() > 1e-6
        torch.testing.assert_close(moves[2]["G"][key], 2 * move, rtol=0, atol=1e-13)
    for key, move in moves[1]["D"].items():
        assert torch.equal(moves[2]["D"][key], move)
    last = read_history(fork)[-1]
    assert last["event"] == "fork" and last["changes"] == {"lr_G": [2e-4, 4e-4], "max_steps": [4, 5]}
    assert json.loads((fork / "config.json").read_text())["lr_G"] == 4e-4  # config.json: what is in use now


def test_a_longer_run_says_how_its_schedule_jumps(tmp_path, capsys):
    out = tmp_path / "run"
    trainer_for(out, max_steps=8).fit(stop_at_step=4)
    capsys.readouterr()
    resumed = trainer_for(out, max_steps=16)
    resumed.fit(resume_from="latest", stop_at_step=5)
    said = capsys.readouterr().out
    # Over 8 steps: 2 of warmup, then 4 of 6 decay steps left at step 4 = 0.6667. Over 16: 4 of warmup,
    # so step 4 is the end of the warmup = 1.
    assert "max_steps 8 -> 16" in said
    assert "schedule of G is recomputed" in said and "from 0.6667 to 1 " in said
    assert read_metrics(out / "metrics.jsonl")[-1]["lr/G"] == pytest.approx(2e-4)


# -- every process agrees on an error --------------------------------------------------------------------
def _agree(out_dir: str) -> None:
    """On each of two processes: three failures that only one process, or only the main one, can see."""
    import errno
    from pathlib import Path

    from accelerate import PartialState

    import gan_accel.callbacks.metrics_log as metrics_log

    out = Path(out_dir)
    seen = []

    def attempt(name, run):
        try:
            run()
            seen.append(f"{name}: finished")
        except Exception as error:  # every rank must get here with the same class and message
            seen.append(f"{name}: {type(error).__name__}: {error}")

    # 1. a disk full for the main process's metrics log at step 3 (the other rank writes nothing there)
    original = metrics_log.MetricsLogger.on_log

    def full_disk(self, trainer, row):
        if trainer.accelerator.is_main_process and row["step"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(trainer.output_dir / self.filename))
        original(self, trainer, row)

    metrics_log.MetricsLogger.on_log = full_disk
    attempt("disk", lambda: trainer_for(out / "disk", reset=False).fit())
    metrics_log.MetricsLogger.on_log = original
    # 2. a checkpoint written by one process, resumed on two
    attempt("processes", lambda: trainer_for(out / "one", reset=False).fit(resume_from="latest"))
    # 3. a folder held by another run (the test process holds the lock)
    attempt("lock", lambda: trainer_for(out / "held", reset=False).fit())
    rank = PartialState().process_index  # asked only now: asking first would set the state up without gloo
    (out / f"seen_{rank}.txt").write_text("\n".join(seen))


@pytest.mark.slow
def test_two_processes_agree_on_every_error_and_none_hangs(tmp_path):
    from conftest import launch_two_processes

    trainer_for(tmp_path / "one", max_steps=2).fit()
    with RunLock(tmp_path / "held"):
        launch_two_processes(_agree, args=(str(tmp_path),))
    seen = [(tmp_path / f"seen_{rank}.txt").read_text().splitlines() for rank in (0, 1)]
    assert seen[0] == seen[1], seen
    disk, processes, lock = seen[0]
    assert disk.startswith("disk: RunFolderError: cannot write") and "No space left on device (ENOSPC)" in disk
    assert "The last complete checkpoint is" in disk and "checkpoint_00000002" in disk
    assert processes.startswith("processes: CheckpointError:") and "written by 1 process(es) and this run has 2" in processes
    assert lock.startswith("lock: RunFolderError:") and "in use by another run" in lock


# -- bounds ---------------------------------------------------------------------------------------
def test_gif_steps_are_evenly_spaced_and_stable_under_pruning():
    assert gif_steps(range(1, 11), 20) == list(range(1, 11))
    assert gif_steps(range(1, 101), 5) == [1, 26, 50, 75, 100]
    assert gif_steps([3, 9, 10], 1) == [10]
    for every, last, frames in [(1, 300, 7), (3, 100, 10), (7, 50, 4), (5, 5, 3), (10, 95, 9), (1, 2000, 100)]:
        schedule = sorted({*range(every, last + 1, every), last})
        chosen = gif_steps(schedule, frames)
        assert len(chosen) <= frames and chosen[0] == schedule[0] and chosen[-1] == last
        scheduled = scheduled_gif_steps(every, last, frames)
        assert scheduled is None if len(schedule) <= frames else scheduled == set(chosen)
        kept = sorted(set(chosen) | set(schedule[-3:]))  # what a run keeps: the GIF's and the newest
        assert gif_steps(kept, frames) == chosen


def test_keep_samples_prunes_old_grids_and_the_gif_keeps_its_frames(tmp_path):
    out = tmp_path / "run"
    trainer_for(out, max_steps=30, sample_every=1, checkpoint_every=100, keep_samples=3, gif_frames=5).fit()
    shown = scheduled_gif_steps(1, 30, 5)
    assert sorted(stamped_samples(out)) == sorted(shown | {28, 29, 30})
    with Image.open(out / "progress.gif") as gif:
        assert gif.n_frames == 5
        for index, step in enumerate(sorted(shown)):
            gif.seek(index)
            with Image.open(out / f"samples_{step:06d}.png") as grid:
                assert gif.convert("RGB").tobytes() == grid.convert("RGB").tobytes()
            assert gif.info["duration"] == (1500 if index == 4 else 250)


def test_bounds_are_validated_in_one_line():
    with pytest.raises(ConfigError, match=r"keep_samples=0 is invalid: expected an integer >= 1, or None"):
        TrainConfig(keep_samples=0)
    with pytest.raises(ConfigError, match=r"gif_frames=0 is invalid"):
        TrainConfig(gif_frames=0)
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from dcgan_mnist import parse_args
    finally:
        sys.path.remove(str(ROOT / "examples"))
    args = parse_args(["--keep-samples", "5", "--gif-frames", "7"])
    assert (args.keep_samples, args.gif_frames) == (5, 7)
    assert parse_args([]).keep_samples is None and parse_args([]).gif_frames == 100


GIF_MEMORY = """
import os, sys, threading, time
from pathlib import Path
import numpy as np
from PIL import Image
from gan_accel.pictures.grids import save_gif
folder, count = Path(sys.argv[1]), int(sys.argv[2])
colours = np.random.default_rng(0).integers(0, 255, (16, 3), dtype=np.uint8)
for i in range(8):  # 120x120 pictures of 16 colours in blocks, each listed count / 8 times
    blocks = np.random.default_rng(i).integers(0, 16, (15, 15))
    Image.fromarray(colours[np.kron(blocks, np.ones((8, 8), dtype=int))]).save(folder / f"{i}.png")
frames = [folder / f"{i % 8}.png" for i in range(count)]
def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
save_gif(frames[:2], folder / "warm.gif")
peak, done = [0], threading.Event()
def watch():  # the resident size while the GIF is written, every 2 ms
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)
start = rss()
watcher = threading.Thread(target=watch)
watcher.start()
save_gif(frames, folder / "a.gif")
done.set()
watcher.join()
print(peak[0] - start)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc for the resident size")
def test_a_gif_of_thousands_of_frames_stays_under_a_memory_bound(tmp_path):
    """Pillow's writer held every frame until the end (the reported run: 1.47 GB peak for 2,010 grids); this
    one holds one. Pillow's writer grows by about 75 MB on these 1000 frames (measured on this machine)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", GIF_MEMORY, str(tmp_path), "1000"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    grown_kb = int(done.stdout.split()[-1])
    assert grown_kb < 10_000, f"writing a GIF of 1000 frames of 120x120 grew the process by {grown_kb} KB"
    with Image.open(tmp_path / "a.gif") as gif:
        assert gif.n_frames == 1000
