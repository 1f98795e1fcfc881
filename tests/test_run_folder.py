"""One run per folder, forward only: one writer, a new run only in an empty folder, ``latest`` continues in
place, any other checkpoint forks into a new folder, and a run deletes only its own pruned checkpoints and
sample grids. Config changes on resume are refused or applied for real.

Each test starts from what a user (or a crash) does and checks what is on disk afterwards against what was
there before (file bytes, rows, checkpoint names), or the optimizer against an independent update.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import Z_DIM, TableLatents, make_images, make_loader, make_models, params, reset_accelerate_state
from gan_accel import CheckpointError, GANTrainer, TrainConfig, list_checkpoints
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.callbacks.sample_saver import gif_steps, scheduled_gif_steps, stamped_samples
from gan_accel.cli import main as cli_main
from gan_accel.cli.common import CommandError, check_new_output
from gan_accel.config import compare_configs
from gan_accel.errors import ConfigError, RunFolderError
from gan_accel.storage.checkpoint import read_marker
from gan_accel.storage.layout import read_metrics_tolerant
from gan_accel.storage.lock import RunLock
from gan_accel.storage.run_folder import managing_run, output_dir_refusal, read_history

ROOT = Path(__file__).resolve().parents[1]
CK = "checkpoints/checkpoint_{:08d}"


def trainer_for(out, reset: bool = True, **overrides) -> GANTrainer:
    cfg = dict(max_steps=8, batch_size=4, z_dim=Z_DIM, log_every=1, sample_every=2, checkpoint_every=2,
               keep_checkpoints=10, num_samples=4, output_dir=str(out), progress_bar=False, warmup_ratio=0.25)
    cfg.update(overrides)
    if reset:  # not inside a launched process: its state is the process group's
        reset_accelerate_state()
    G, D = make_models()
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(make_images(64), cfg["batch_size"]), TrainConfig(**cfg), latent_sampler=latents)
    latents.rewind()
    return trainer


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as their target's text), relative path -> bytes."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[name] = f"-> {os.readlink(path)}".encode()
        elif path.is_file():
            found[name] = path.read_bytes()
    return found


def steps(out) -> list[int]:
    return [row["step"] for row in read_metrics(out / "metrics.jsonl")]


def events(out) -> list[str]:
    return [entry["event"] for entry in read_history(out)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """8 steps, checkpoints 2..8, grids every 2 steps: copied by the tests that change it."""
    out = tmp_path_factory.mktemp("run_folder") / "run"
    trainer_for(out).fit()
    return out


def copy_run(source: Path, where: Path) -> Path:
    shutil.copytree(source, where, symlinks=True)
    return where


# -- one writer per folder ------------------------------------------------------------------------
def test_a_held_folder_is_refused_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    with RunLock(out):  # another run holds the folder
        with pytest.raises(RunFolderError, match=r"in use by another run \(pid \d+ on .*since"):
            trainer_for(out).fit()
        with pytest.raises(RunFolderError, match="in use by another run"):
            trainer_for(out).fit(resume_from="latest")
    assert sorted(tree(out)) == [".lock"], "a refused run writes nothing"
    trainer_for(out).fit()  # released: the folder (a lock file alone) is usable again
    assert steps(out) == list(range(1, 9))


def test_the_lock_is_released_on_any_exit_and_a_stale_one_is_not_obeyed(tmp_path):
    out = tmp_path / "run"
    trainer = trainer_for(out)

    class Boom(Exception):
        pass

    def explode(*_):
        raise Boom()

    trainer.runner.run_step = explode
    with pytest.raises(Boom):
        trainer.fit()
    assert not trainer.lock.held
    shutil.rmtree(out)
    out.mkdir()
    # A lock file left by a process that died (pid that cannot exist): the kernel lock is gone with it.
    (out / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 999999999, "since": "yesterday"}))
    trainer_for(out).fit()
    assert steps(out) == list(range(1, 9))


# -- a new run only in an absent or empty folder ----------------------------------------------------------
def test_a_new_run_in_a_folder_that_holds_anything_is_refused_in_one_line(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path / "runs" / "x")
    before = tree(run)
    with pytest.raises(RunFolderError) as refused:
        trainer_for(run).fit()
    assert str(refused.value) == (f"{run} holds a run: continue it with `--resume latest`, or choose another "
                                  "`--output-dir` (gan-accel never deletes a run)")
    assert tree(run) == before, "nothing in it is touched"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="mine holds a run"):
        trainer_for(mine).fit()
    assert tree(mine) == {"notes.txt": b"mine"}


def test_an_output_dir_that_is_a_file_is_named_as_a_file_not_as_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError) as refused:
        trainer_for(tmp_path / "notes.txt").fit()
    assert "notes.txt is a file, not a folder" in str(refused.value) and "holds a run" not in str(refused.value)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_run_that_crashed_before_its_first_checkpoint_cannot_be_resumed_and_starts_again(tmp_path):
    out = tmp_path / "run"
    trainer = trainer_for(out, checkpoint_every=100)
    original = trainer.runner.run_step

    def crash_at_step_3(*args):
        if trainer.step == 3:
            raise KeyboardInterrupt
        original(*args)

    trainer.runner.run_step = crash_at_step_3
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        trainer_for(out).fit(resume_from="latest")
    before = tree(out)
    with pytest.raises(CheckpointError, match="does not exist"):  # a fork from nothing: refused before any removal
        trainer_for(out).fit(resume_from=tmp_path / "nowhere")
    assert {n: d for n, d in tree(out).items() if n != ".lock"} == {n: d for n, d in before.items() if n != ".lock"}
    trainer_for(out).fit()  # the same fit again: what the crashed run wrote is replaced
    assert steps(out) == list(range(1, 9)) and events(out) == ["start", "restart", "start"]


def test_fit_twice_on_one_trainer_continues_its_own_run(tmp_path):
    out = tmp_path / "run"
    trainer = trainer_for(out)
    trainer.fit(stop_at_step=4)
    grids = {n: (out / n).read_bytes() for n in ("samples_000002.png", "samples_000004.png")}
    trainer.fit()
    assert steps(out) == list(range(1, 9)) and events(out) == ["start"]
    assert all((out / n).read_bytes() == data for n, data in grids.items())
    assert (out / "progress.gif").exists()


# -- latest continues in place; any other checkpoint is a fork into a new folder ---------------------------------
def test_latest_continues_the_run_in_place_with_its_run_id(tmp_path):
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=4)
    resumed = trainer_for(out)
    resumed.fit(resume_from="latest")
    assert steps(out) == list(range(1, 9)) and events(out) == ["start", "resume"]
    ids = {read_marker(p)["run_id"] for p in list_checkpoints(out)}
    assert ids == {resumed.state.run_id} == {read_history(out)[0]["run_id"]}
    # The path of the latest checkpoint is the same as 'latest'.
    trainer_for(out, max_steps=10).fit(resume_from=out / CK.format(8))
    assert steps(out) == list(range(1, 11)) and events(out)[-1] == "resume"


def test_an_older_checkpoint_of_the_folder_is_refused_and_forks_into_a_new_one(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path / "run")
    before = tree(run)
    older = run / CK.format(4)
    with pytest.raises(RunFolderError) as refused:
        trainer_for(run).fit(resume_from=older)
    line = str(refused.value)
    assert "\n" not in line and "an older checkpoint" in line and "checkpoint_00000008" in line
    assert f"`--resume {older} --output-dir NEW`" in line and "`--resume latest`" in line
    assert tree(run) == before
    fork = trainer_for(tmp_path / "fork")
    fork.fit(resume_from=older)
    assert steps(tmp_path / "fork") == [5, 6, 7, 8]
    [entry] = read_history(tmp_path / "fork")
    assert entry["event"] == "fork" and entry["source"] == str(older) and entry["step"] == 4
    assert fork.state.run_id != read_marker(older)["run_id"]
    assert {read_marker(p)["run_id"] for p in list_checkpoints(tmp_path / "fork")} == {fork.state.run_id}
    assert tree(run) == before, "the forked run is untouched"
    assert fork.fit() == fork.last_metrics  # nothing left to train


def test_another_runs_checkpoint_forks_only_into_an_empty_folder(finished_run, tmp_path):
    a = copy_run(finished_run, tmp_path / "a")
    b = tmp_path / "b"
    trainer_for(b).fit(stop_at_step=2)
    before_a, before_b = tree(a), tree(b)
    with pytest.raises(RunFolderError, match=r"starts a new run from it, in --output-dir: .*b holds a run"):
        trainer_for(b).fit(resume_from=a / CK.format(4))
    assert tree(a) == before_a and tree(b) == before_b
    trainer_for(tmp_path / "c").fit(resume_from=a / CK.format(4))
    assert steps(tmp_path / "c") == [5, 6, 7, 8] and tree(a) == before_a


# -- what a run deletes: its own pruned checkpoints and sample grids -------------------------------------------
def test_pruning_removes_only_the_checkpoints_own_files(tmp_path):
    out = tmp_path / "run"
    trainer_for(out, max_steps=6, keep_checkpoints=1).fit(stop_at_step=2)
    (out / CK.format(2) / "user.png").write_bytes(b"mine")
    (out / CK.format(2) / "notes").mkdir()
    (out / CK.format(2) / "notes" / "n.txt").write_text("mine")
    trainer_for(out, max_steps=6, keep_checkpoints=1).fit(resume_from="latest")
    assert sorted(tree(out / CK.format(2))) == ["notes/n.txt", "user.png"], "only the checkpoint's own files went"
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint_00000006"]


def test_pruning_never_removes_another_runs_checkpoint_or_follows_a_link(finished_run, tmp_path):
    a = copy_run(finished_run, tmp_path / "a")
    b = tmp_path / "b"
    trainer_for(b, max_steps=8, keep_checkpoints=1).fit(stop_at_step=4)
    shutil.copytree(a / CK.format(2), b / CK.format(1))  # run A's checkpoint, copied in by hand
    (b / CK.format(3)).symlink_to(a / CK.format(6), target_is_directory=True)
    before_a = tree(a)
    trainer_for(b, max_steps=8, keep_checkpoints=1).fit(resume_from="latest")
    assert [p.name for p in list_checkpoints(b)] == ["checkpoint_00000001", "checkpoint_00000003",
                                                     "checkpoint_00000008"]
    assert (b / CK.format(3)).is_symlink() and tree(a) == before_a


def test_a_folder_where_the_next_checkpoint_goes_stops_the_save_and_is_kept(tmp_path):
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=2)
    mine = out / CK.format(4)
    mine.mkdir()
    (mine / "000000.png").write_bytes(b"png")
    with pytest.raises(RunFolderError) as stopped:
        trainer_for(out).fit(resume_from="latest")
    line = str(stopped.value)
    assert "\n" not in line and f"cannot write checkpoint {mine}: that folder exists" in line
    assert "move it away, then resume" in line and "checkpoint_00000002" in line
    assert (mine / "000000.png").read_bytes() == b"png"
    shutil.move(str(mine), str(tmp_path / "moved_away"))
    trainer_for(out).fit(resume_from="latest")
    assert [p.name for p in list_checkpoints(out)][-1] == "checkpoint_00000008"


def test_a_save_cut_short_is_cleared_by_the_save_of_its_step(tmp_path):
    out = tmp_path / "run"
    trainer_for(out, max_steps=4).fit(stop_at_step=2)
    stale = out / "checkpoints" / ".tmp-checkpoint_00000004"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    trainer_for(out, max_steps=4).fit(resume_from="latest")
    assert not stale.exists() and read_marker(out / CK.format(4))["step"] == 4


# -- appended logs: completed, read tolerantly --------------------------------------------------------------------
def test_a_crash_mid_row_leaves_a_log_every_reader_reads_and_the_run_goes_on(tmp_path):
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=4)  # then a crash after row 5, while row 6 and a history line were written
    for name, torn in (("metrics.jsonl", '{"step": 5, "loss/D": 123.0}\n{"step": 6, "lo'), ("history.jsonl", '{"ev')):
        with open(out / name, "a") as log:
            log.write(torn)
    trainer_for(out).fit(resume_from="latest")
    assert steps(out) == list(range(1, 9)), "the rows logged again after the checkpoint supersede the earlier ones"
    assert read_metrics(out / "metrics.jsonl")[4]["loss/D"] != 123.0
    rows, skipped = read_metrics_tolerant(out / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(1, 9)) and skipped == 1
    assert events(out) == ["start", "resume"]
    assert not list(out.glob("*.torn")) and (out / "training_plot.png").is_file()
    lines = (out / "history.jsonl").read_text().splitlines()
    assert lines[1] == '{"ev' and json.loads(lines[2])["event"] == "resume", "completed, never rewritten"


def test_gan_accel_plot_draws_a_torn_log_and_says_so(finished_run, tmp_path, capsys):
    run = copy_run(finished_run, tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as log:
        log.write('{"step": 9, "lo')
    before = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert cli_main(["plot", str(run), "--out", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "note: metrics.jsonl: 1 unreadable row(s) skipped" in out
    assert (run / "metrics.jsonl").read_bytes() == before, "a reader never writes"


# -- a run inside another run's checkpoints/ or trackers/ ----------------------------------------------------
def test_output_dir_inside_another_runs_checkpoints_or_trackers_is_refused(finished_run, tmp_path):
    a = copy_run(finished_run, tmp_path / "a")
    (a / "trackers").mkdir()
    before = tree(a)
    (tmp_path / "link").symlink_to(a / "checkpoints")
    for where in (a / CK.format(2) / "nested", a / "checkpoints" / "mine", a / "trackers" / "run",
                  tmp_path / "link" / "mine"):
        with pytest.raises(RunFolderError) as refused:
            trainer_for(where, max_steps=2).fit()
        line = str(refused.value)
        assert "\n" not in line and f"which belongs to the run in {a}" in line and "choose a folder outside" in line
        assert not os.path.lexists(where)
    assert tree(a) == before, "nothing written in run A"
    assert output_dir_refusal(tmp_path / "b") is None and output_dir_refusal(tmp_path) is None


def test_a_folder_named_checkpoints_of_something_that_is_no_run_is_not_claimed(tmp_path):
    home = tmp_path / "home"
    (home / "checkpoints").mkdir(parents=True)
    (home / "config.json").write_text("{}")  # a project folder with its own config, not a gan_accel run
    assert managing_run(home / "checkpoints" / "myrun") is None
    trainer_for(home / "checkpoints" / "myrun", max_steps=2).fit()


def test_output_dir_whose_checkpoints_folder_is_a_run_is_refused(finished_run, tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    copy_run(finished_run, outer / "checkpoints")
    with pytest.raises(RunFolderError, match=r"its checkpoints/ folder is itself a run folder"):
        trainer_for(outer, max_steps=2).fit()
    assert sorted(p.name for p in outer.iterdir()) == ["checkpoints"]


def test_gan_accel_out_inside_a_runs_checkpoints_is_refused(finished_run, tmp_path, capsys):
    run = copy_run(finished_run, tmp_path / "run")
    for out in (run / "checkpoints" / "pngs", run / CK.format(10), run / CK.format(2) / "grid.png"):
        with pytest.raises(CommandError, match=f"which belongs to the run in {run}"):
            check_new_output(out)
    check_new_output(run / "my_grid.png")  # the run's own folder, a name it never writes: allowed
    capsys.readouterr()
    code = cli_main(["plot", str(run), "--out", str(run / "checkpoints" / "plot.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --out") and "belongs to the run" in err[0]
    assert not (run / "checkpoints" / "plot.png").exists()


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
