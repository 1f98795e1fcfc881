"""Only what the run wrote, only inside its folder, is ever removed or moved; the folder stays consistent
after any failure, and its growth is bounded.

Each test builds the situation a user (or a crash) creates, then checks what is on disk afterwards:
the bytes of everything that must survive, the manifest against the files, the one line that was said.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import Z_DIM, TableLatents, make_images, make_loader, make_models, reset_accelerate_state
from gan_accel import GANTrainer, TrainConfig, list_checkpoints
from gan_accel.callbacks.samples import gif_steps, scheduled_gif_steps, stamped_samples
from gan_accel.cli import main as cli_main
from gan_accel.cli.common import CommandError, check_new_output
from gan_accel.errors import ConfigError, RunFolderError
from gan_accel.state import branch
from gan_accel.state.layout import read_metrics, read_metrics_tolerant
from gan_accel.state.paths import managing_run, output_dir_refusal, refusal
from gan_accel.state.run_folder import RunFolder, repair_torn_tail

ROOT = Path(__file__).resolve().parents[1]
CK = "checkpoints/checkpoint_{:08d}"


def trainer_for(out, **overrides) -> GANTrainer:
    cfg = dict(max_steps=8, batch_size=4, z_dim=Z_DIM, log_every=1, sample_every=2, checkpoint_every=2,
               keep_checkpoints=10, num_samples=4, output_dir=str(out), progress_bar=False, warmup_ratio=0.25)
    cfg.update(overrides)
    reset_accelerate_state()
    G, D = make_models()
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(make_images(64), cfg["batch_size"]), TrainConfig(**cfg),
                         latent_sampler=latents)
    latents.rewind()
    return trainer


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as their target's text), relative path -> bytes."""
    out = {}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[name] = f"-> {os.readlink(path)}".encode()
        elif path.is_file():
            out[name] = path.read_bytes()
    return out


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def tamper(out: Path, **entries: int) -> None:
    """Add entries to the run's manifest, as a hand edit or a corrupted file would."""
    data = manifest(out)
    data["files"].update(entries)
    (out / "manifest.json").write_text(json.dumps(data))


def events(out: Path) -> list[dict]:
    return RunFolder(out, writer=False).history()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """8 steps, checkpoints 2..8, grids every 2 steps: copied by the tests that change it."""
    out = tmp_path_factory.mktemp("safety") / "run"
    trainer_for(out).fit()
    return out


def copy_run(source: Path, where: Path) -> Path:
    shutil.copytree(source, where, symlinks=True)
    return where


# -- rule 2: containment --------------------------------------------------------------------------------
def test_refusal_names_every_entry_that_is_not_inside_the_folder(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("x")
    (run / "link.png").symlink_to(outside / "f.txt")
    (run / "via").symlink_to(outside)
    (run / "inner.png").write_text("mine")
    (run / "to_inner.png").symlink_to(run / "inner.png")  # a link even to inside: the run never writes links
    cases = {
        "../outside/f.txt": "goes up out of the run folder with '..'",
        "checkpoints/../inner.png": "goes up",
        str(outside / "f.txt"): "is an absolute path",
        str(run / "inner.png"): "is an absolute path",
        "": "names the run folder itself",
        ".": "names the run folder itself",
        "manifest.json": "is the run's own manifest.json",
        ".lock": "is the run's own .lock",
        "history.jsonl": "is the run's own history.jsonl",
        "checkpoints": "is the run's own checkpoints",
        "checkpoints/abandoned/": "is the run's own checkpoints/abandoned",
        "link.png": "it is a symbolic link (to " + str(outside / "f.txt"),
        "via/f.txt": "a folder on its way (via) is a symbolic link",
        "to_inner.png": "it is a symbolic link",
    }
    for name, says in cases.items():
        why = refusal(run, name)
        assert why is not None and says in why, (name, why)
    for inside in ("inner.png", "./inner.png", "checkpoints/checkpoint_00000002", "not_there_yet.png"):
        assert refusal(run, inside) is None, inside


def test_overwrite_never_touches_a_manifest_entry_outside_the_folder(finished_run, tmp_path, capsys):
    """The reported case: ``../../../elsewhere/file.txt`` and an absolute path were both deleted."""
    out = copy_run(finished_run, tmp_path / "a" / "b" / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "file.txt").write_text("keep me")
    (tmp_path / "absolute.txt").write_text("keep me too")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root")
    (out / "samples_000002.png").unlink()
    (out / "samples_000002.png").symlink_to(tmp_path / "etc" / "passwd")  # a run file replaced by a link out
    (out / "checkpoints" / "my_notes.txt").write_text("mine")
    (out / CK.format(6) / "mine.png").write_bytes(b"png")  # dropped into a checkpoint the run recorded
    tamper(out, **{"../../../elsewhere/file.txt": 1, str(tmp_path / "absolute.txt"): 1, "checkpoints": 0,
                   "manifest.json": 0, ".lock": 0})
    capsys.readouterr()
    trainer_for(out, overwrite=True, max_steps=2).fit()
    said = [line for line in capsys.readouterr().out.splitlines() if "left" in line]
    assert len(said) == 1 and said[0].startswith("gan_accel: overwrite: left 7 manifest entries in place")
    assert said[0].count(" (") >= 6 and said[0].endswith("; and 1 more (see history.jsonl)")
    left = " ".join(next(e for e in events(out) if e["event"] == "overwrite")["left"])
    for name in ("../../../elsewhere/file.txt (goes up", "absolute.txt (is an absolute path",
                 "samples_000002.png (it is a symbolic link", "checkpoints (is the run's own",
                 "manifest.json (is the run's own", ".lock (is the run's own",
                 f"{CK.format(6)} (holds files the checkpoint did not write: mine.png; they stay)"):
        assert name in left, name
    assert (elsewhere / "file.txt").read_text() == "keep me"
    assert (tmp_path / "absolute.txt").read_text() == "keep me too"
    assert (tmp_path / "etc" / "passwd").read_text() == "root"
    assert (out / "checkpoints" / "my_notes.txt").read_text() == "mine", "checkpoints/ listed: only its checkpoints go"
    assert sorted(tree(out / CK.format(6))) == ["mine.png"], "the checkpoint's own files went, the user's stayed"
    overwrite = next(e for e in events(out) if e["event"] == "overwrite")
    assert len(overwrite["left"]) == 7 and "checkpoints/checkpoint_00000008" in overwrite["removed"]
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint_00000002"], "the new run's only"


def test_a_recorded_path_outside_the_folder_is_not_recorded(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    folder = RunFolder(run, writer=True)
    folder.start()
    folder.record(tmp_path / "elsewhere.txt", 3)
    folder.record(run / "inside.txt", 3)
    assert manifest(run)["files"] == {"inside.txt": 3}
    assert "elsewhere.txt is not recorded as a file of the run" in capsys.readouterr().out
    (tmp_path / "user.png").write_text("x")
    assert not folder.discard(tmp_path / "user.png") and (tmp_path / "user.png").exists()
    (run / "unrecorded.png").write_text("x")
    assert not folder.discard(run / "unrecorded.png") and (run / "unrecorded.png").exists()


def test_a_branch_leaves_an_entry_that_is_a_link_in_place(finished_run, tmp_path, capsys):
    out = copy_run(finished_run, tmp_path / "run")
    (tmp_path / "target.png").write_bytes(b"the user's")
    (out / "samples_000008.png").unlink()
    (out / "samples_000008.png").symlink_to(tmp_path / "target.png")
    capsys.readouterr()
    trainer_for(out).fit(resume_from=out / CK.format(4), stop_at_step=5)
    said = capsys.readouterr().out
    assert "left 1 manifest entry in place" in said and "samples_000008.png (it is a symbolic link" in said
    assert (out / "samples_000008.png").is_symlink() and (tmp_path / "target.png").read_bytes() == b"the user's"
    aside = next((out / "checkpoints" / "abandoned").iterdir())
    assert (aside / "samples_000006.png").is_file() and not (aside / "samples_000008.png").exists()


# -- rule 2: ownership ----------------------------------------------------------------------------------
def test_output_dir_in_a_folder_another_run_manages_is_refused_before_anything_is_written(finished_run, tmp_path):
    """The reported case: a run nested in another run's checkpoints/ was deleted by that run's pruning."""
    a = copy_run(finished_run, tmp_path / "a")
    (a / "trackers").mkdir()
    before = tree(a)
    (tmp_path / "link").symlink_to(a / "checkpoints")
    for where in (a / CK.format(2) / "nested", a / CK.format(2), a / "checkpoints", a / "checkpoints" / "mine",
                  a / "checkpoints" / "abandoned" / "x", a / "trackers" / "run", tmp_path / "link" / "mine"):
        with pytest.raises(RunFolderError) as refused:
            trainer_for(where, max_steps=2).fit()
        line = str(refused.value)
        assert "\n" not in line and f"which the run in {a} manages" in line and "choose a folder outside" in line, line
        assert not os.path.lexists(where) or where in (a / CK.format(2), a / "checkpoints")
    assert tree(a) == before, "nothing written in run A"
    # A run folder inside another's own folder, beside it, or above it is not managed by it.
    assert output_dir_refusal(a / "sub") is None and output_dir_refusal(tmp_path) is None
    assert output_dir_refusal(tmp_path / "b") is None


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


def test_gan_accel_out_inside_a_runs_managed_folders_is_refused(finished_run, tmp_path, capsys):
    run = copy_run(finished_run, tmp_path / "run")
    for out in (run / "checkpoints" / "pngs", run / CK.format(10), run / CK.format(2) / "grid.png",
                run / "checkpoints" / "abandoned" / "x.npz"):
        with pytest.raises(CommandError, match=f"which the run in {run} manages"):
            check_new_output(out)
    check_new_output(run / "my_grid.png")  # the run's own folder, a name it never writes: allowed
    capsys.readouterr()
    code = cli_main(["plot", str(run), "--out", str(run / "checkpoints" / "plot.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --out") and "manages" in err[0]
    assert not (run / "checkpoints" / "plot.png").exists()


def test_a_users_folder_where_the_next_checkpoint_goes_stops_the_save_and_is_kept(finished_run, tmp_path, capsys):
    """The reported case: PNGs sampled into checkpoints/checkpoint_N were removed by the checkpoint of step N."""
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=2)
    mine = out / CK.format(4)
    mine.mkdir()
    (mine / "000000.png").write_bytes(b"png")
    with pytest.raises(RunFolderError) as stopped:
        trainer_for(out).fit(resume_from="latest")
    line = str(stopped.value)
    assert "\n" not in line and f"cannot write checkpoint {mine}: that folder exists and this run did not write it" \
        in line and "move it away, then resume" in line and "checkpoint_00000002" in line
    assert (mine / "000000.png").read_bytes() == b"png"
    shutil.move(str(mine), str(tmp_path / "moved_away"))
    trainer_for(out).fit(resume_from="latest")
    assert [p.name for p in list_checkpoints(out)][-1] == "checkpoint_00000008"


def test_pruning_keeps_files_the_checkpoint_did_not_write(tmp_path, capsys):
    out = tmp_path / "run"
    trainer_for(out, max_steps=6, keep_checkpoints=1).fit(stop_at_step=2)
    (out / CK.format(2) / "user.png").write_bytes(b"mine")
    (out / CK.format(2) / "notes").mkdir()
    (out / CK.format(2) / "notes" / "n.txt").write_text("mine")
    capsys.readouterr()
    trainer_for(out, max_steps=6, keep_checkpoints=1).fit(resume_from="latest")
    said = [line for line in capsys.readouterr().out.splitlines() if "pruned" in line]
    assert len(said) == 1 and "kept" in said[0] and "notes/n.txt, user.png" in said[0]
    assert sorted(tree(out / CK.format(2))) == ["notes/n.txt", "user.png"], "only the checkpoint's own files went"
    assert [p.name for p in list_checkpoints(out)] == ["checkpoint_00000006"]
    assert CK.format(2) not in manifest(out)["files"]


def test_pruning_never_removes_another_runs_checkpoint_or_follows_a_link(finished_run, tmp_path):
    a = copy_run(finished_run, tmp_path / "a")
    b = tmp_path / "b"
    trainer_for(b, max_steps=8, keep_checkpoints=1).fit(stop_at_step=4)
    shutil.copytree(a / CK.format(2), b / CK.format(1))  # run A's checkpoint, copied in by hand
    (b / CK.format(3)).symlink_to(a / CK.format(4), target_is_directory=True)
    before_a = tree(a)
    trainer_for(b, max_steps=8, keep_checkpoints=1).fit(resume_from=b / CK.format(4))
    assert (b / CK.format(1) / "COMPLETE").is_file() and (b / CK.format(3)).is_symlink()
    assert tree(a) == before_a
    recorded = [n for n in manifest(b)["files"] if n.startswith("checkpoints/")]
    assert recorded == [CK.format(8)], "another run's checkpoint is not recorded as this run's"


def test_the_next_save_clears_only_its_own_stale_folders(tmp_path):
    out = tmp_path / "run"
    trainer_for(out, max_steps=4).fit(stop_at_step=2)
    root = out / "checkpoints"
    (root / ".tmp-checkpoint_00000009").mkdir()  # a save cut short by a crash
    (root / ".tmp-notes").mkdir()
    (root / ".tmp-notes" / "n.txt").write_text("mine")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "f").write_text("x")
    (root / ".tmp-checkpoint_00000010").symlink_to(tmp_path / "keep", target_is_directory=True)
    trainer_for(out, max_steps=4).fit(resume_from="latest")
    assert not (root / ".tmp-checkpoint_00000009").exists()
    assert (root / ".tmp-notes" / "n.txt").read_text() == "mine"
    assert (root / ".tmp-checkpoint_00000010").is_symlink() and (tmp_path / "keep" / "f").read_text() == "x"


def test_an_older_checkpoint_without_a_file_list_is_pruned_by_the_kinds_of_file_it_holds(tmp_path):
    out = tmp_path / "run"
    trainer_for(out, max_steps=4, keep_checkpoints=1).fit(stop_at_step=2)
    complete = out / CK.format(2) / "COMPLETE"
    marker = json.loads(complete.read_text())
    assert "model.safetensors" in marker.pop("files")
    complete.write_text(json.dumps(marker))  # as written before COMPLETE listed the files
    (out / CK.format(2) / "grid.png").write_bytes(b"mine")
    trainer_for(out, max_steps=4, keep_checkpoints=1).fit(resume_from="latest")
    assert sorted(tree(out / CK.format(2))) == ["grid.png"]


# -- rule 7: torn tails -----------------------------------------------------------------------------------
def test_a_torn_metrics_row_is_repaired_once_and_the_resumed_run_samples_on(tmp_path, capsys):
    """The reported case: the next row was glued to the torn one, and the run died at its first sample step
    (JSONDecodeError in the plot callback)."""
    out = tmp_path / "run"
    trainer = trainer_for(out)
    trainer.fit(stop_at_step=4)
    torn = '{"step": 5, "loss/D": 0.'
    with open(out / "metrics.jsonl", "a") as log:
        log.write(torn)
    capsys.readouterr()
    trainer.fit()  # the same trainer goes on: no resume moves the row aside
    said = [line for line in capsys.readouterr().out.splitlines() if "cut short" in line]
    assert said == ["gan_accel: metrics.jsonl ended in a line cut short by a crash (24 bytes): kept them in "
                    "metrics.jsonl.torn and removed them from metrics.jsonl, which goes on from its last whole line"]
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == list(range(1, 9))
    assert (out / "metrics.jsonl.torn").read_text() == torn + "\n"
    assert manifest(out)["files"]["metrics.jsonl.torn"] == 0
    assert (out / "training_plot.png").is_file() and (out / "progress.gif").is_file()
    assert [e["event"] for e in events(out)].count("repair") == 1
    trainer_for(out, max_steps=9).fit(resume_from="latest")  # nothing left to repair: said once
    assert "cut short" not in capsys.readouterr().out and [e["event"] for e in events(out)].count("repair") == 1


def test_a_torn_metrics_row_before_a_resume(tmp_path, capsys):
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=6)
    with open(out / "metrics.jsonl", "a") as log:
        log.write('{"step": 7, "lo')
    trainer_for(out).fit(resume_from="latest")
    assert "metrics.jsonl ended in a line cut short" in capsys.readouterr().out
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == list(range(1, 9))
    assert (out / "metrics.jsonl.torn").read_text() == '{"step": 7, "lo\n'


def test_a_torn_history_line_is_repaired_and_every_reader_goes_on(tmp_path, capsys):
    out = tmp_path / "run"
    trainer_for(out).fit(stop_at_step=4)
    with open(out / "history.jsonl", "a") as history:
        history.write('{"event": "resu')
    assert [e["event"] for e in events(out)] == ["start"], "read tolerantly before the repair"
    trainer_for(out).fit(resume_from="latest")
    assert "history.jsonl ended in a line cut short by a crash (15 bytes)" in capsys.readouterr().out
    assert [e["event"] for e in events(out)] == ["start", "repair", "resume"]
    assert (out / "history.jsonl.torn").read_text() == '{"event": "resu\n'
    assert all(json.loads(line) for line in (out / "history.jsonl").read_text().splitlines())


def test_a_whole_last_row_without_its_newline_keeps_the_row(tmp_path):
    log, side = tmp_path / "metrics.jsonl", tmp_path / "metrics.jsonl.torn"
    log.write_text('{"step": 1}\n{"step": 2}')
    assert repair_torn_tail(log, side) == ("newline", 1)
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n' and not side.exists()
    assert repair_torn_tail(log, side) == (None, 0)
    log.write_text('{"ste')  # a log whose only line is torn
    assert repair_torn_tail(log, side) == ("torn", 5) and log.read_text() == "" and side.read_text() == '{"ste\n'


def test_a_row_glued_to_a_torn_one_is_still_read(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, "lo{"step": 3, "loss/D": 0.5}\n{"step": 4}\n')
    rows, skipped = read_metrics_tolerant(log)
    assert [row["step"] for row in rows] == [1, 3, 4] and skipped == 1


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


# -- rule 7: a failure while a resume moves files aside ------------------------------------------------------
def _resume_with_replace_failing(out: Path, failing_call: int | None, code: int = errno.ENOSPC, monkeypatch=None):
    """Resume step 4 of a finished 8-step run (a branch), with the ``failing_call``-th ``os.replace`` made while
    files move aside failing with ``code``; returns how many calls the move made."""
    real_replace, calls = os.replace, [0]

    def replace(src, dst, *args, **kwargs):
        calls[0] += 1
        if calls[0] == failing_call:
            raise OSError(code, os.strerror(code), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    original = branch.move_aside

    def move_aside(*args, **kwargs):
        monkeypatch.setattr(os, "replace", replace)
        try:
            return original(*args, **kwargs)
        finally:
            monkeypatch.setattr(os, "replace", real_replace)

    monkeypatch.setattr("gan_accel.state.run_folder.move_aside", move_aside)
    try:
        trainer_for(out).fit(resume_from=out / CK.format(4), stop_at_step=5)
    finally:
        monkeypatch.setattr("gan_accel.state.run_folder.move_aside", original)
    return calls[0]


def _consistent(out: Path) -> None:
    """Every manifest entry exists; every file in an abandoned folder is recorded; no folder is left empty."""
    files = manifest(out)["files"]
    assert all(os.path.lexists(out / name) for name in files), [n for n in files if not os.path.lexists(out / n)]
    abandoned = out / "checkpoints" / "abandoned"
    if abandoned.exists():
        for label in abandoned.iterdir():
            for item in label.iterdir():
                assert item.relative_to(out).as_posix() in files, item
        assert not [p for p in abandoned.rglob("*") if p.is_dir() and not any(p.iterdir())]
        assert any(abandoned.iterdir()), "an empty abandoned/ is removed"


def _contents(out: Path) -> dict[str, bytes]:
    """What the run holds, wherever it was moved: basename -> bytes, metrics rows by step."""
    found = {}
    for path in [*out.glob("samples_*.png"), *(out / "checkpoints").rglob("COMPLETE"),
                 *(out / "checkpoints" / "abandoned").rglob("samples_*.png"), out / "generator.safetensors",
                 *(out / "checkpoints" / "abandoned").rglob("generator.safetensors")]:
        if path.is_file():
            key = path.parent.name if path.name == "COMPLETE" else path.name
            assert key not in found, f"{key} twice"
            found[key] = path.read_bytes()
    rows = [*read_metrics_tolerant(out / "metrics.jsonl")[0],
            *(r for log in (out / "checkpoints" / "abandoned").rglob("metrics.jsonl") for r in read_metrics(log))]
    steps = sorted(r["step"] for r in rows)
    assert steps == sorted(set(steps)), "a metrics row in two places"
    found["rows"] = json.dumps(steps).encode()
    return found


@pytest.fixture(scope="module")
def move_calls(finished_run, tmp_path_factory) -> int:
    """How many ``os.replace`` calls a branch of the finished run makes (the plan, each move, each record)."""
    mp = pytest.MonkeyPatch()
    try:
        return _resume_with_replace_failing(copy_run(finished_run, tmp_path_factory.mktemp("count") / "run"), None,
                                            monkeypatch=mp)
    finally:
        mp.undo()


@pytest.mark.parametrize("failing_call", [1, 2, 3, 4, 5, -4, -3, -2, -1])
def test_a_failure_at_any_point_of_the_move_leaves_the_folder_consistent_and_a_retry_finishes(
        finished_run, move_calls, tmp_path, monkeypatch, failing_call):
    """The calls: 1 the plan, then each move and its record, then the metrics rows aside (-3), the log without
    them (-2) and the manifest without the plan (-1)."""
    assert move_calls == 20, "the plan, 8 moves and their records, 2 metrics writes, the end of the plan"
    failing_call = failing_call if failing_call > 0 else move_calls + 1 + failing_call
    out = copy_run(finished_run, tmp_path / "run")
    before = _contents(out)
    with pytest.raises(RunFolderError) as stopped:
        _resume_with_replace_failing(out, failing_call, monkeypatch=monkeypatch)
    line = str(stopped.value)
    assert "\n" not in line and "No space left on device (ENOSPC)" in line and "nothing deleted" in line
    assert "resume the same checkpoint again to finish the move" in line
    _consistent(out)
    assert _contents(out) == before, "nothing lost, nothing in two places"
    assert events(out)[-1]["event"] == "move_failed"
    trainer_for(out).fit(resume_from=out / CK.format(4), stop_at_step=5)  # the same resume, again
    _consistent(out)
    assert len(list((out / "checkpoints" / "abandoned").iterdir())) == 1, "finished in the same folder"
    assert "moving" not in manifest(out)
    aside = next((out / "checkpoints" / "abandoned").iterdir())
    assert sorted(p.name for p in aside.iterdir()) == [
        "checkpoint_00000006", "checkpoint_00000008", "generator.safetensors", "metrics.jsonl", "progress.gif",
        "samples_000006.png", "samples_000008.png", "samples_final.png", "training_plot.png"]
    assert [r["step"] for r in read_metrics(aside / "metrics.jsonl")] == [5, 6, 7, 8]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_a_move_to_another_file_system_copies_then_removes(finished_run, tmp_path, monkeypatch):
    out = copy_run(finished_run, tmp_path / "run")
    grid = (out / "samples_000008.png").read_bytes()
    real_replace = os.replace

    def cross_device(src, dst, *args, **kwargs):  # the run's top level on one disk, checkpoints/ on another
        if Path(src).parent == out and "abandoned" in str(dst):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", cross_device)
    trainer_for(out).fit(resume_from=out / CK.format(4), stop_at_step=5)
    monkeypatch.setattr(os, "replace", real_replace)
    aside = next((out / "checkpoints" / "abandoned").iterdir())
    assert (aside / "samples_000008.png").read_bytes() == grid and not (out / "samples_000008.png").exists()
    _consistent(out)


# -- rule 7: bounds ---------------------------------------------------------------------------------------
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
    recorded = sorted(n for n in manifest(out)["files"] if n.startswith("samples_0"))
    assert recorded == [f"samples_{s:06d}.png" for s in sorted(shown | {28, 29, 30})]
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
from gan_accel.pictures.samples import save_gif
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
