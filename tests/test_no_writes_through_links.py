"""Nothing outside the run is written, truncated or deleted through a link (docs/security.md).

A user's file outside the run (``victim``) is linked into a run folder where gan_accel writes, keeps open or
prunes a file: the lock, the logs, the config, the progress grids, the generator's folder, a checkpoint's
files, the temporary name of an atomic write. Each case checks the victim's bytes (or its folder's contents)
afterwards against what they were, and that a refusal is one line naming the link.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from gan_accel import list_checkpoints
from gan_accel.errors import RunFolderError
from gan_accel.storage.files import atomic_path, make_own_folder, remove_tree, temporary_name, write_bytes_synced
from gan_accel.storage.layout import append_line
from gan_accel.storage.lock import RunLock
from test_run_folder import CK, trainer_for

MINE = b"the user's own file, not the run's\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    """A user's file outside any run."""
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(MINE)
    return path


def one_line(error: BaseException, *names: object) -> str:
    text = str(error)
    assert "\n" not in text and all(str(name) in text for name in names), text
    return text


# -- the lock ------------------------------------------------------------------------------------------------
def test_a_lock_that_is_a_link_is_refused_and_its_target_kept(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    with pytest.raises(RunFolderError) as refused:
        RunLock(run).acquire()
    assert "symbolic link" in one_line(refused.value, run / ".lock", "remove the link")
    assert victim.read_bytes() == MINE
    with pytest.raises(RunFolderError):  # the trainer takes the lock the same way: nothing is trained
        trainer_for(run).fit()
    assert victim.read_bytes() == MINE and sorted(p.name for p in run.iterdir()) == [".lock"]


def test_a_dangling_lock_link_creates_nothing_where_it_points(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(tmp_path / "made-by-the-run")
    with pytest.raises(RunFolderError):
        RunLock(run).acquire()
    assert not (tmp_path / "made-by-the-run").exists()


def test_a_fifo_lock_is_refused_at_once_not_waited_on(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / ".lock")
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: _capture(lambda: RunLock(run).acquire(), outcome), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "taking the lock hung on a FIFO"
    assert isinstance(outcome[0], RunFolderError) and "not a regular file" in str(outcome[0])


def _capture(call, into: list) -> None:
    try:
        call()
    except BaseException as error:  # noqa: BLE001 - handed to the test
        into.append(error)


# -- files written in place or atomically --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["history.jsonl", "metrics.jsonl"])
def test_an_appended_log_that_is_a_link_is_refused_in_one_line(tmp_path, victim, name):
    (tmp_path / name).symlink_to(victim)
    with pytest.raises(RunFolderError) as refused:
        append_line(tmp_path / name, {"step": 1})
    one_line(refused.value, tmp_path / name, "symbolic link")
    assert victim.read_bytes() == MINE


def test_a_resumed_run_never_appends_its_history_through_a_link(tmp_path, victim):
    run = tmp_path / "run"
    trainer_for(run, max_steps=4).fit(stop_at_step=2)
    (run / "history.jsonl").unlink()
    (run / "history.jsonl").symlink_to(victim)
    with pytest.raises(RunFolderError) as refused:
        trainer_for(run, max_steps=4).fit(resume_from="latest")
    one_line(refused.value, run / "history.jsonl")
    assert victim.read_bytes() == MINE


def test_files_the_run_replaces_replace_the_link_not_its_target(tmp_path, victim):
    """config.json, the progress grids and fixed_noise are written beside and renamed: the link goes, the
    user's file stays as it was."""
    run = tmp_path / "run"
    trainer_for(run, max_steps=4).fit(stop_at_step=2)
    links = [run / "config.json", run / "samples_000004.png", run / "fixed_noise.safetensors"]
    for link in links:
        link.unlink(missing_ok=True)
        link.symlink_to(victim)
    trainer_for(run, max_steps=4).fit(resume_from="latest")
    assert victim.read_bytes() == MINE
    assert not any(link.is_symlink() for link in links) and json.loads((run / "config.json").read_text())


def test_a_stale_temporary_that_is_a_link_is_never_written_through(tmp_path, victim):
    """The temporary name of an atomic write is predictable (host, pid): a link left there is removed, not
    followed; the file lands where it belongs."""
    target = tmp_path / "data.json"
    temporary_name(target).symlink_to(victim)
    write_bytes_synced(target, b"{}")
    assert victim.read_bytes() == MINE and target.read_bytes() == b"{}"
    temporary_name(target).symlink_to(victim)
    with atomic_path(target) as tmp:
        tmp.write_text("[]")  # what a caller does: write to the temporary by name
    assert victim.read_bytes() == MINE and target.read_text() == "[]"


def test_a_generator_folder_that_is_a_link_is_refused_and_nothing_lands_outside(tmp_path):
    run = tmp_path / "run"
    outside = tmp_path / "outside"
    outside.mkdir()
    trainer_for(run, max_steps=4).fit(stop_at_step=2)
    (run / "generator").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunFolderError) as refused:
        trainer_for(run, max_steps=4).fit(resume_from="latest")
    one_line(refused.value, run / "generator", "symbolic link")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["checkpoints", "trackers", "metrics.jsonl"])
def test_a_new_run_is_refused_before_any_step_where_a_link_stands_in_its_folder(tmp_path, victim, name):
    run = tmp_path / "run"
    run.mkdir()
    target = victim if "." in name else victim.parent
    (run / name).symlink_to(target, target_is_directory=target.is_dir())
    before = sorted(p.name for p in victim.parent.iterdir())
    with pytest.raises(RunFolderError) as refused:
        trainer_for(run).fit()
    one_line(refused.value, run / name, "symbolic link", "output_dir")
    assert sorted(p.name for p in victim.parent.iterdir()) == before and victim.read_bytes() == MINE
    assert sorted(p.name for p in run.iterdir()) == [name], "refused before the lock or any file was written"


@pytest.mark.parametrize("name", [".lock", "history.jsonl", "metrics.jsonl"])
def test_a_fifo_where_the_run_appends_refuses_the_resume_before_any_step(tmp_path, name):
    run = tmp_path / "run"
    trainer_for(run, max_steps=4).fit(stop_at_step=2)
    (run / name).unlink()
    os.mkfifo(run / name)
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: _capture(lambda: trainer_for(run, max_steps=4).fit(resume_from="latest"),
                                                      outcome), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the resume hung on a FIFO"
    assert isinstance(outcome[0], RunFolderError), outcome
    one_line(outcome[0], run / name, "not a regular file")
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint_00000002"], "no step was trained"


def test_the_output_dir_itself_may_be_a_link(tmp_path):
    """The folder the user names is theirs to place: a link to a folder on another disk is used as that folder."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "disk", target_is_directory=True)
    trainer_for(tmp_path / "run", max_steps=2).fit()
    assert (tmp_path / "disk" / "generator" / "model.safetensors").is_file()


def test_a_run_folder_of_its_own_is_made_or_refused_when_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    assert make_own_folder(tmp_path / "run" / "trackers", "the trackers' files").is_dir()
    (tmp_path / "run" / "generator").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunFolderError):
        make_own_folder(tmp_path / "run" / "generator", "the generator")


# -- deletion --------------------------------------------------------------------------------------------
def test_pruning_never_deletes_through_a_folder_link_inside_a_checkpoint(tmp_path, victim):
    """An old checkpoint whose COMPLETE lists ``sub/victim.txt``, ``sub`` being a link to a folder outside the
    run, and a listed file that is itself a link: pruning removes the links' names, never what they point to."""
    run = tmp_path / "run"
    trainer_for(run, max_steps=4, keep_checkpoints=1).fit(stop_at_step=2)
    old = run / CK.format(2)
    (old / "sub").symlink_to(victim.parent, target_is_directory=True)
    other = victim.parent / "weights.bin"
    other.write_bytes(MINE)
    (old / "linked.txt").symlink_to(other)
    marker = json.loads((old / "COMPLETE").read_text())
    marker["files"] += ["sub/victim.txt", "linked.txt"]
    (old / "COMPLETE").write_text(json.dumps(marker))
    trainer_for(run, max_steps=4, keep_checkpoints=1).fit(resume_from="latest")
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint_00000004"]
    assert victim.read_bytes() == MINE and other.read_bytes() == MINE
    assert not (old / "linked.txt").is_symlink(), "a listed link is the save's name: removed as a link"


def test_removing_a_tree_unlinks_a_link_and_never_empties_its_target(tmp_path, victim):
    (tmp_path / "link").symlink_to(victim.parent, target_is_directory=True)
    remove_tree(tmp_path / "link")
    assert not os.path.lexists(tmp_path / "link") and victim.read_bytes() == MINE
    folder = tmp_path / ".tmp-checkpoint_00000002"
    folder.mkdir()
    (folder / "inner").symlink_to(victim.parent, target_is_directory=True)
    remove_tree(folder)
    assert not folder.exists() and victim.read_bytes() == MINE


# -- caches ------------------------------------------------------------------------------------------------
def test_the_image_cache_build_never_writes_through_a_link_at_its_temporary_names(tmp_path, victim):
    """The build's temporaries carry this process's id: links left under those names (the array's and its
    compacted copy's) are removed as names, and the cache is built where it belongs."""
    from test_data_safety import _folder, _open, _prep_files

    root, cache = _folder(tmp_path / "imgs"), tmp_path / "cache"
    data = _open(root, cache)
    npy, record = _prep_files(data)
    tmp = temporary_name(npy)
    record.unlink()  # the next open builds again
    npy.unlink()
    tmp.symlink_to(victim)
    tmp.with_name(tmp.name + ".compact").symlink_to(victim)
    again = _open(root, cache)
    assert victim.read_bytes() == MINE and len(again) == len(data) and npy.is_file() and not npy.is_symlink()


# -- exports ---------------------------------------------------------------------------------------------
def test_an_export_never_fills_or_empties_a_folder_linked_at_its_temporary_name(tmp_path, victim, capsys):
    """The export is written into a temporary folder beside DIR, named after this process: a link left under
    that name to a folder of the user's is removed as a link, and the folder keeps its files."""
    from gan_accel.hub import export_generator
    from cli_runs import cli, train

    run = tmp_path / "run"
    train(run, steps=2, ema=None)
    out = tmp_path / "gan"
    temporary_name(out).symlink_to(victim.parent, target_is_directory=True)
    before = sorted(p.name for p in victim.parent.iterdir())
    export_generator(run, out)  # the Python API
    assert sorted(p.name for p in victim.parent.iterdir()) == before and victim.read_bytes() == MINE
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "samples.png"]
    temporary_name(tmp_path / "gan2").symlink_to(victim.parent, target_is_directory=True)
    code, _, err = cli(["export", run, tmp_path / "gan2"], capsys)  # the command, which probes the name first
    assert code == 0, err
    assert sorted(p.name for p in victim.parent.iterdir()) == before and victim.read_bytes() == MINE
