"""The run folder keeps data: one writer, a manifest, a dated history, branches, forks, config changes.

Each test starts from what a user would do and checks what is on disk afterwards against what was
there before (file bytes, rows, checkpoint names), or the optimizer against an independent update.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import Z_DIM, TableLatents, make_images, make_loader, make_models, params, reset_accelerate_state
from gan_accel import CheckpointError, GANTrainer, PreflightError, TrainConfig, list_checkpoints
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.config import compare_configs
from gan_accel.errors import RunFolderError
from gan_accel.state.lock import RunLock
from gan_accel.state.run_folder import HISTORY, MANIFEST, RunFolder


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


def names(folder) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def steps(out) -> list[int]:
    return [row["step"] for row in read_metrics(out / "metrics.jsonl")]


def history(out) -> list[dict]:
    return RunFolder(out, writer=False).history()


# -- one writer per folder ------------------------------------------------------------------------
def test_a_held_folder_is_refused_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    with RunLock(out):  # another run holds the folder
        with pytest.raises(RunFolderError, match=r"in use by another run \(pid \d+ on .*since"):
            trainer_for(out).fit()
        with pytest.raises(RunFolderError, match="in use by another run"):
            trainer_for(out).fit(resume_from="latest")
    assert names(out) == [".lock"], "a refused run writes nothing"
    trainer_for(out).fit()  # released: the folder is usable again
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
    # A lock file left by a process that died (pid that cannot exist): the kernel lock is gone with it.
    (out / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 999999999, "since": "yesterday"}))
    trainer_for(out, overwrite=True).fit()
    assert steps(out) == list(range(1, 9))


# -- overwrite removes only what the run recorded -----------------------------------------------------
def test_overwrite_removes_only_the_files_the_run_recorded_and_says_which(tmp_path, capsys):
    out = tmp_path / "run"
    trainer_for(out).fit()
    first = set(names(out))
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints" / "my_weights.pt").write_text("mine")
    trainer_for(out, overwrite=True, max_steps=4).fit()
    said = capsys.readouterr().out
    removed = next(e["removed"] for e in history(out) if e["event"] == "overwrite")
    assert f"overwrite: removed {len(removed)} file(s)" in said
    assert set(removed) == set(first) - {MANIFEST, HISTORY, ".lock"} - {
        n for n in first if n.startswith("checkpoints/checkpoint_")} | {
        f"checkpoints/{p}" for p in ("checkpoint_00000002", "checkpoint_00000004", "checkpoint_00000006",
                                     "checkpoint_00000008")}
    assert (out / "notes.txt").read_text() == "mine" and (out / "checkpoints" / "my_weights.pt").read_text() == "mine"
    assert steps(out) == [1, 2, 3, 4]
    assert not (out / "samples_000008.png").exists() and "samples_000008.png" in first
    assert [e["event"] for e in history(out)] == ["start", "overwrite", "start"], "the history is only appended to"


def test_overwrite_refuses_files_named_like_a_run_that_no_run_recorded(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "samples_000002.png").write_bytes(b"the user's picture")
    with pytest.raises(PreflightError, match=r"no gan_accel run recorded as its own \(samples_000002.png\)"):
        trainer_for(out, overwrite=True).fit()
    assert (out / "samples_000002.png").read_bytes() == b"the user's picture"
    assert not (out / "config.json").exists()


def test_fit_twice_on_one_trainer_with_overwrite_keeps_the_first_call(tmp_path):
    out = tmp_path / "run"
    trainer = trainer_for(out, overwrite=True)
    trainer.fit(stop_at_step=4)
    grids = {n: (out / n).read_bytes() for n in ("samples_000002.png", "samples_000004.png")}
    trainer.fit()
    assert steps(out) == list(range(1, 9))
    assert all((out / n).read_bytes() == data for n, data in grids.items())
    assert (out / "progress.gif").exists()


def test_a_run_that_crashed_before_its_first_checkpoint_is_not_called_resumable(tmp_path):
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
    with pytest.raises(PreflightError, match="stopped before its first checkpoint .*nothing to resume.*overwrite=True"):
        trainer_for(out).fit()
    trainer_for(out, overwrite=True).fit()
    assert steps(out) == list(range(1, 9))


# -- checkpoints form a history --------------------------------------------------------------------
def test_resuming_an_older_checkpoint_starts_a_branch_and_latest_follows_it(tmp_path):
    out = tmp_path / "run"
    trainer_for(out).fit()
    assert [p.name for p in list_checkpoints(out)][-1] == "checkpoint_00000008"
    old_8 = (out / "checkpoints" / "checkpoint_00000008" / "COMPLETE").read_text()
    old_grid = (out / "samples_000006.png").read_bytes()

    branch = trainer_for(out, max_steps=8)
    branch.fit(resume_from=out / "checkpoints" / "checkpoint_00000004", stop_at_step=6)
    aside = next((out / "checkpoints" / "abandoned").iterdir())
    assert sorted(p.name for p in aside.iterdir() if p.name.startswith("checkpoint_")) == [
        "checkpoint_00000006", "checkpoint_00000008"]
    assert (aside / "checkpoint_00000008" / "COMPLETE").read_text() == old_8, "moved, not rewritten"
    assert (aside / "samples_000006.png").read_bytes() == old_grid
    assert [r["step"] for r in read_metrics(aside / "metrics.jsonl")] == [5, 6, 7, 8]
    assert steps(out) == [1, 2, 3, 4, 5, 6]
    # 'latest' is the newest checkpoint of this branch (6), not the abandoned 8.
    latest = trainer_for(out)
    latest.fit(resume_from="latest", stop_at_step=7)
    assert latest.resumed_from.name == "checkpoint_00000006"
    assert history(out)[-2]["event"] == "branch" and history(out)[-2]["step"] == 4
    # The resumed checkpoint of the branch point is not pruned by the abandoned newer ones.
    assert (out / "checkpoints" / "checkpoint_00000004").is_dir()


def test_a_checkpoint_of_another_run_folder_is_refused_unless_forked(tmp_path):
    run_a, run_b, fork = tmp_path / "a", tmp_path / "b", tmp_path / "fork"
    trainer_for(run_a).fit()
    trainer_for(run_b).fit()
    before = {n: (run_b / n).read_bytes() for n in names(run_b)}
    a_checkpoint = run_a / "checkpoints" / "checkpoint_00000004"
    with pytest.raises(RunFolderError, match=r"belongs to the run in .*a, not to output_dir .*b.*fork=True"):
        trainer_for(run_b).fit(resume_from=a_checkpoint)
    with pytest.raises(PreflightError, match="already holds a run"):
        trainer_for(run_b).fit(resume_from=a_checkpoint, fork=True)  # forking into a run's folder: refused too
    assert {n: (run_b / n).read_bytes() for n in names(run_b)} == before, "run B is untouched"
    forked = trainer_for(fork)
    forked.fit(resume_from=a_checkpoint, fork=True)
    assert steps(fork) == [5, 6, 7, 8]
    event = history(fork)[0]
    assert event["event"] == "fork" and event["source"] == str(a_checkpoint) and event["step"] == 4
    assert forked.run_id != RunFolder(run_a, writer=False).run_id
    # The fork's own checkpoints resume into the fork; run A's still do not.
    trainer_for(fork, max_steps=10).fit(resume_from="latest")
    with pytest.raises(RunFolderError, match="belongs to the run in"):
        trainer_for(fork).fit(resume_from=a_checkpoint)


def test_the_manifest_lists_exactly_the_files_the_run_wrote(tmp_path):
    out = tmp_path / "run"
    trainer_for(out, keep_checkpoints=2).fit()
    recorded = set(json.loads((out / MANIFEST).read_text())["files"])
    on_disk = {n for n in names(out) if not n.startswith("checkpoints/")} - {MANIFEST, HISTORY, ".lock"}
    on_disk |= {f"checkpoints/{p.name}" for p in list_checkpoints(out)}
    assert recorded == on_disk  # pruned checkpoints are gone from both


# -- a run's history is its config -------------------------------------------------------------------
def test_fixed_fields_are_refused_with_every_difference_before_anything_is_loaded(tmp_path):
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=4)
    before = {n: (out / n).read_bytes() for n in names(out)}
    with pytest.raises(CheckpointError, match=r"batch_size: 4 -> 2; loss: 'nonsaturating' -> 'hinge'"):
        trainer_for(out, batch_size=2, loss="hinge").fit(resume_from="latest")
    with pytest.raises(CheckpointError, match=r"r1_gamma: None -> 1.0"):  # switching a penalty on adds a phase
        trainer_for(out, r1_gamma=1.0).fit(resume_from="latest")
    assert {n: (out / n).read_bytes() for n in names(out) if n != ".lock"} == \
        {n: d for n, d in before.items() if n != ".lock"}


def test_compare_configs_sorts_every_field_into_fixed_or_changeable():
    saved = TrainConfig(model={"width": 8}, extra={"note": "a"}).to_dict()
    refused, changed = compare_configs(saved, TrainConfig(lr_G=1e-3, r1_gamma=None, max_steps=9, model={"width": 16},
                                                          extra={"note": "b"}, output_dir="elsewhere", z_dim=7).to_dict())
    assert refused == ["model: {'width': 8} -> {'width': 16}", "z_dim: 100 -> 7"]
    assert changed == {"lr_G": [2e-4, 1e-3], "max_steps": [2000, 9], "extra.note": ["a", "b"]}
    # tuples from a live config equal the lists of one read back from JSON
    assert compare_configs(json.loads(json.dumps(saved)), saved) == ([], {})


def test_a_config_from_before_the_model_field_compares_by_its_extra_model():
    """Runs written before ``model`` was a field kept the networks' spec in ``extra["model"]``."""
    old = TrainConfig(extra={"model": {"width": 8}, "note": "a"}).to_dict()
    assert old["model"] is None
    assert compare_configs(old, TrainConfig(model={"width": 8}, extra={"note": "a"}).to_dict()) == ([], {})
    refused, _ = compare_configs(old, TrainConfig(model={"width": 16}, extra={"note": "a"}).to_dict())
    assert refused == ["model: {'width': 8} -> {'width': 16}"]
    assert TrainConfig.from_dict(old).model == {"width": 8}


def test_a_changed_learning_rate_on_resume_really_changes_the_update(tmp_path):
    """Adam's update is linear in the rate: from one checkpoint, one step with G's rate doubled moves
    every weight of G exactly twice as far (D, updated first, is unchanged, so G's gradients and
    moments are the same). The rate is also logged and dated."""
    out = tmp_path / "run"
    first = trainer_for(out, lr_schedule="constant", warmup_ratio=0.0, max_steps=4)
    first.fit()
    before = {"G": params(first.G), "D": params(first.D)}  # the weights in checkpoint 4
    moves = {}
    for factor in (1, 2):
        resumed = trainer_for(out, lr_schedule="constant", warmup_ratio=0.0, max_steps=5, lr_G=2e-4 * factor)
        resumed.fit(resume_from=out / "checkpoints" / "checkpoint_00000004")
        moves[factor] = {net: {k: params(getattr(resumed, net))[k] - v for k, v in before[net].items()}
                         for net in ("G", "D")}
        assert resumed.opt_G.param_groups[0]["lr"] == 2e-4 * factor
        assert read_metrics(out / "metrics.jsonl")[-1]["lr/G"] == 2e-4 * factor
    for key, move in moves[1]["G"].items():
        assert move.abs().max() > 1e-6
        torch.testing.assert_close(moves[2]["G"][key], 2 * move, rtol=0, atol=1e-13)
    for key, move in moves[1]["D"].items():
        assert torch.equal(moves[2]["D"][key], move)
    last = history(out)[-1]
    assert last["changes"] == {"lr_G": [2e-4, 4e-4], "max_steps": [4, 5]}
    assert json.loads((out / "config.json").read_text())["lr_G"] == 4e-4  # config.json: what is in use now


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
    original = metrics_log.MetricsLog.write

    def full_disk(self, row):
        if self.enabled and row["step"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        original(self, row)

    metrics_log.MetricsLog.write = full_disk
    attempt("disk", lambda: trainer_for(out / "disk", reset=False).fit())
    metrics_log.MetricsLog.write = original
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
