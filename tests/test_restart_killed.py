"""A run killed before its first checkpoint starts again with the same command: what it wrote is replaced, and
only that; anything else in the folder, a live holder, a clean end or a complete checkpoint keeps it refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from gan_accel.engine.run_open import resolve_auto, restart_killed
from gan_accel.errors import RunFolderError
from gan_accel.storage.lock import RunLock
from gan_accel.storage.run_folder import check_new_run

# What a run writes before its first checkpoint, spelled out here rather than taken from the package's lists.
ATTEMPT = ["config.json", "data.json", "fixed_noise.safetensors", "health.json", "metrics.jsonl",
           "samples_000002.png", "training_plot.png", ".config.json.host.123.tmp"]


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: the pid names no process
    return child.pid


def killed_run(folder: Path, outside: Path, holder: dict | None = None) -> None:
    """A folder as a run killed at step 2 leaves it: its files, an unfinished checkpoint, trackers/ holding a link
    to a file outside the run, and its lock record."""
    folder.mkdir()
    for name in ATTEMPT:
        (folder / name).write_text("x")
    (folder / "checkpoints" / ".tmp-checkpoint_00000004").mkdir(parents=True)
    (folder / "checkpoints" / ".tmp-checkpoint_00000004" / "model.safetensors").write_text("x")
    (folder / "trackers").mkdir()
    os.symlink(outside, folder / "trackers" / "events")
    (folder / "history.jsonl").write_text('{"event": "start", "run_id": "a"}\n')
    record = holder or {"host": socket.gethostname(), "pid": dead_pid(), "since": "2026-01-01 00:00:00"}
    (folder / ".lock").write_text(json.dumps(record))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "keep.txt"
    path.write_text("the user's")
    return path


def restart(folder: Path) -> str | None:
    lock = RunLock(folder)
    lock.acquire()  # what fit() does first: the record a dead holder left is read under the lock
    try:
        return restart_killed(folder, lock.previous, None)
    finally:
        lock.release()


def test_the_files_of_a_killed_run_are_replaced_and_only_those(tmp_path, outside):
    run = tmp_path / "run"
    killed_run(run, outside)
    check_new_run(run)  # before the data: the same command is not refused
    assert resolve_auto(run) is None  # --resume auto: a new run there
    line = restart(run)
    assert line is not None and "killed before its first checkpoint" in line and "history.jsonl keeps" in line
    assert sorted(os.listdir(run)) == [".lock", "history.jsonl"]
    assert outside.read_text() == "the user's"  # trackers/ went, the file its link named did not
    events = [json.loads(line)["event"] for line in (run / "history.jsonl").read_text().splitlines()]
    assert events == ["start", "restart"]
    check_new_run(run)  # now as good as empty


@pytest.mark.parametrize("stranger", ["notes.txt", "link"])
def test_a_file_the_run_did_not_write_keeps_the_folder_refused_and_untouched(tmp_path, outside, stranger):
    run = tmp_path / "run"
    killed_run(run, outside)
    if stranger == "link":
        (run / "samples_000002.png").unlink()
        os.symlink(outside, run / "samples_000002.png")  # a run never writes a link
    else:
        (run / stranger).write_text("mine")
    before = sorted(os.listdir(run))
    with pytest.raises(RunFolderError, match=r"killed before its first checkpoint .*which that run did not write: "
                                             r"move it away, and the same command starts the run again"):
        check_new_run(run)
    assert restart(run) is None
    assert sorted(os.listdir(run)) == before and outside.read_text() == "the user's"


@pytest.mark.parametrize("case", ["running", "ended cleanly", "checkpoint"])
def test_a_live_holder_a_clean_end_or_a_checkpoint_is_a_run_not_a_killed_attempt(tmp_path, outside, case):
    run = tmp_path / "run"
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": "now"} if case == "running" else None
    killed_run(run, outside, holder)
    if case == "ended cleanly":
        (run / ".lock").write_text("")
    if case == "checkpoint":
        (run / "checkpoints" / "checkpoint_00000002").mkdir()
        (run / "checkpoints" / "checkpoint_00000002" / "COMPLETE").write_text("{}")
    with pytest.raises(RunFolderError, match="holds a run: continue it with `--resume latest`"):
        check_new_run(run)
    if case != "running":  # a running holder's lock cannot be taken
        assert restart(run) is None
        assert "config.json" in os.listdir(run)


def test_a_crashed_holder_leaves_its_record_until_a_run_takes_the_folder_over(tmp_path):
    lock = RunLock(tmp_path / "a")
    lock.acquire()
    lock.release(RuntimeError("Connection closed by peer"))
    record = json.loads((tmp_path / "a" / ".lock").read_text())
    assert record["pid"] == os.getpid() and record["ended"] == "RuntimeError"
    lock.acquire()
    assert lock.previous["ended"] == "RuntimeError"
    lock.release()  # a fit that stopped before taking the folder over (a refused --resume) keeps the record
    assert json.loads((tmp_path / "a" / ".lock").read_text()) == record
    lock.acquire()
    lock.previous = None  # what a run that takes the folder over does
    lock.release()
    assert (tmp_path / "a" / ".lock").read_text() == ""
