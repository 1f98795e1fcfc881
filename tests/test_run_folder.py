"""One run per folder, forward only: one writer, a new run only in an empty folder, ``latest`` continues in
place, any other checkpoint forks into a new folder, a run deletes only its own pruned checkpoints and
sample grids, appended logs are read tolerantly, and no run goes inside another run's checkpoints/ or trackers/.

Each test starts from what a user (or a crash) does and checks what is on disk afterwards against what was
there before (file bytes, rows, checkpoint names). Config changes on resume, every process agreeing on an
error and the bounds on sample grids are in tests/test_run_folder_config.py; other test files import this
file's ``trainer_for`` and ``CK``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import Z_DIM, TableLatents, make_images, make_loader, make_models, reset_accelerate_state
from gan_accel import CheckpointError, GANTrainer, TrainConfig, list_checkpoints
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.cli import main as cli_main
from gan_accel.cli.common import CommandError, check_new_output
from gan_accel.errors import RunFolderError
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



class FakeWindowsLocks:
    """``msvcrt.locking`` as Windows does it: a byte range from the descriptor's position, locked by one descriptor
    at a time (in one process here, so that the test sees a refusal without a second process)."""
    LK_UNLCK, LK_NBLCK = 0, 2

    def __init__(self) -> None:
        self.held: dict[tuple, int] = {}
        self.calls: list[tuple[int, int]] = []

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        info, at = os.fstat(fd), os.lseek(fd, 0, os.SEEK_CUR)
        key = (info.st_dev, info.st_ino, at, nbytes)
        self.calls.append((mode, at))
        if mode == self.LK_NBLCK:
            if key in self.held:
                raise PermissionError(13, "Permission denied")  # what Windows raises for a range locked elsewhere
            self.held[key] = fd
        else:
            assert self.held.pop(key) == fd, "unlocked by the descriptor that locked it"


def test_the_lock_works_without_fcntl_and_pread_as_on_windows(tmp_path, monkeypatch):
    from gan_accel.storage import lock

    windows = FakeWindowsLocks()
    monkeypatch.setattr(lock, "fcntl", None)
    monkeypatch.setattr(lock, "msvcrt", windows)
    for unix_only in ("pread", "pwrite"):
        monkeypatch.delattr(os, unix_only, raising=False)
    out = tmp_path / "run"
    with RunLock(out):
        with pytest.raises(RunFolderError, match=rf"in use by another run \(pid {os.getpid()} on .*since"):
            trainer_for(out).fit()
    assert windows.held == {} and windows.calls[0] == (windows.LK_NBLCK, lock.WINDOWS_LOCKED_BYTE)
    assert lock.WINDOWS_LOCKED_BYTE > 4096, "the locked byte lies past the record a refused run reads"
    trainer_for(out).fit()  # released: usable again, and the run holds and lets go of it the same way
    assert steps(out) == list(range(1, 9)) and windows.held == {}
    assert windows.calls[-1] == (windows.LK_UNLCK, lock.WINDOWS_LOCKED_BYTE)
    assert (out / ".lock").read_text() == "", "a holder that ended as planned leaves no record"



def test_the_files_a_run_reads_and_writes_are_opened_as_bytes_on_windows():
    """Windows' os.open defaults to text mode (CRLF for LF, and a read stops at a Ctrl-Z byte): every descriptor
    through which storage reads or writes a file's content asks for O_BINARY (0 elsewhere)."""
    import ast
    import inspect

    from gan_accel.storage import files, reading

    for module in (files, reading):
        for call in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "os.open":
                assert "BINARY" in ast.unparse(call.args[1]), (module.__name__, ast.unparse(call))


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


def test_a_run_refused_while_the_holder_writes_its_record_still_names_the_holder(tmp_path):
    """The holder empties ``.lock`` before writing its record: a run refused in that moment reads it again."""
    import threading

    from gan_accel.storage.lock import RunLock

    holder = RunLock(tmp_path)
    holder.acquire()
    try:
        (tmp_path / ".lock").write_text("")  # the holder between emptying the file and writing its record
        record = json.dumps({"host": "elsewhere", "pid": 4242, "since": "2026-12-07 10:00:00"})
        threading.Timer(0.2, lambda: (tmp_path / ".lock").write_text(record)).start()
        with pytest.raises(RunFolderError, match=r"in use by another run \(pid 4242 on elsewhere"):
            RunLock(tmp_path).acquire()
    finally:
        holder.release()
