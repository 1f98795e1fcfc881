"""A branch: what a resume of an older checkpoint moves aside, planned first and recorded move by move.

Resuming step ``s`` of a run that went further moves what the run recorded after ``s`` (checkpoints,
step-stamped samples, final files) to ``checkpoints/abandoned/<label>/`` and the metrics rows after
``s`` to that folder's ``metrics.jsonl``. Nothing is deleted.

A move can fail halfway (a full disk, no permission, another file system). So that the folder stays
consistent whatever happens:

1. the plan (the destination and the names) is written to ``manifest.json`` (``"moving"``) before
   the first move;
2. each move is recorded in the manifest as soon as it is made;
3. the metrics rows are written aside and the log rewritten each atomically; if the log cannot be
   rewritten, the copy aside is removed (the rows are never in two places);
4. on a failure, a folder made for the move and left empty is removed, and the run stops with one
   line; resuming the same checkpoint again finds the plan, records any move the manifest could not
   record in time, and finishes into the same folder.

Only entries that name something inside the run folder are moved (see
:func:`gan_accel.state.paths.refusal`); others stay where they are, named in one line.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RunFolderError
from .files import atomic_path, temporary_name, write_failure_reason
from .layout import ABANDONED, CHECKPOINTS, METRICS, checkpoint_root
from .paths import refusal

if TYPE_CHECKING:
    from .run_folder import RunFolder

PLAN = "moving"  # the manifest's key for a move in progress: {"after_step", "dest", "names"}
_SHOWN = 6


def move_aside(folder: "RunFolder", after_step: int) -> tuple[Path, list[str]]:
    """Move what the run in ``folder`` wrote after ``after_step`` aside; returns the folder it went to and the
    moved names (``(folder.path, [])`` when nothing was later). Raises :class:`RunFolderError` if a move fails,
    with every move made so far recorded."""
    dest = _unfinished(folder, after_step)
    later = _later_files(folder, after_step)
    rows = _later_rows(folder.path / METRICS, after_step)
    if not later and not rows:
        if folder.manifest.pop(PLAN, None) is not None:
            _remove_if_empty(dest, checkpoint_root(folder.path))
            folder.save()
        return folder.path, []
    if dest is None:
        dest = checkpoint_root(folder.path) / ABANDONED / f"after_step_{after_step}_{time.strftime('%Y%m%d-%H%M%S')}"
        while os.path.lexists(dest):
            dest = dest.with_name(dest.name + "_")
    folder.manifest[PLAN] = {"after_step": after_step, "dest": folder.relative(dest), "names": later}
    moved: list[str] = []
    step = ["plan in manifest.json the moves to"]  # what was being done, for the message
    try:
        _carry_out(folder, dest, later, rows, after_step, moved, step)
    except OSError as error:
        _stop(folder, dest, error, step[0], after_step, moved, len(later) + bool(rows))
    return dest, moved


def _carry_out(folder: "RunFolder", dest: Path, later: list[str], rows: tuple[list[str], list[str]] | None,
               after_step: int, moved: list[str], step: list[str]) -> None:
    files = folder.manifest["files"]
    folder.save()  # the plan, before anything moves
    step[0] = "create"
    dest.mkdir(parents=True, exist_ok=True)
    for name in later:
        target = dest / Path(name).name
        step[0] = f"move {name} to"
        _move(folder.path / name, target)
        files[folder.relative(target)] = files.pop(name)
        moved.append(name)
        step[0] = f"record in manifest.json that {name} moved to"
        folder.save()
    if rows:
        kept, aside = rows
        step[0] = f"move {len(aside)} metrics row(s) to"
        _move_rows(folder.path / METRICS, dest / METRICS, kept, aside)
        files[folder.relative(dest / METRICS)] = after_step
        moved.append(f"{len(aside)} metrics row(s)")
    del folder.manifest[PLAN]
    step[0] = "record in manifest.json the moves to"
    folder.save()


def _unfinished(folder: "RunFolder", after_step: int) -> Path | None:
    """The folder of an earlier attempt of the same resume that stopped halfway (its plan is in the manifest),
    after recording the moves it made that the manifest could not record in time; else None."""
    plan = folder.manifest.get(PLAN)
    if not (isinstance(plan, dict) and plan.get("after_step") == after_step and isinstance(plan.get("dest"), str)
            and refusal(folder.path, plan["dest"]) is None):
        return None
    dest, files = folder.path / plan["dest"], folder.manifest["files"]
    for name in plan.get("names", []):
        target = dest / Path(str(name)).name
        if name in files and not os.path.lexists(folder.path / name) and os.path.lexists(target):
            files[folder.relative(target)] = files.pop(name)
    if (dest / METRICS).is_file():
        files.setdefault(folder.relative(dest / METRICS), after_step)
    return dest


def _later_files(folder: "RunFolder", after_step: int) -> list[str]:
    """The recorded files and checkpoints written after ``after_step`` that may move; others are named."""
    abandoned = f"{CHECKPOINTS}/{ABANDONED}/"
    later, refused = [], []
    for name in sorted(n for n, step in folder.manifest["files"].items() if step > after_step
                       and not n.startswith(abandoned) and n != METRICS and os.path.lexists(folder.path / n)):
        why = refusal(folder.path, name)
        (later.append(name) if why is None else refused.append(f"{name} ({why})"))
    if refused:
        print(f"gan_accel: left {len(refused)} manifest entr{'y' if len(refused) == 1 else 'ies'} in place, not "
              f"files inside {folder.path}: {'; '.join(refused[:_SHOWN])}")
    return later


def _stop(folder: "RunFolder", dest: Path, error: OSError, doing: str, after_step: int, moved: list[str],
          planned: int) -> None:
    """Leave the folder consistent after a failed move, then raise one line."""
    _remove_if_empty(dest, checkpoint_root(folder.path))
    if not moved and not os.path.lexists(dest):
        folder.manifest.pop(PLAN, None)
    try:
        folder.save()
    except OSError:
        pass  # the plan saved before the first move lets the next attempt record what moved
    try:
        folder.log_event("move_failed", after_step=after_step, moved=moved, error=write_failure_reason(error))
    except OSError:
        pass
    where = getattr(error, "filename", None)
    raise RunFolderError(
        f"cannot {doing} {dest} (resuming step {after_step} moves the run's later files aside): "
        f"{write_failure_reason(error)}{f' at {where}' if where else ''}; {len(moved)} of {planned} moved so far, "
        "each recorded in manifest.json, nothing deleted; fix the cause (free space, permissions) and resume the "
        "same checkpoint again to finish the move") from None


def _move(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``; across file systems (``checkpoints/`` on another disk) a file is copied,
    flushed, put in place, and only then removed from where it was."""
    try:
        os.replace(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV or source.is_dir() or source.is_symlink():
            raise
        partial = temporary_name(target)
        try:
            shutil.copy2(source, partial)
            with open(partial, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        source.unlink()


def _move_rows(log: Path, aside: Path, kept: list[str], moved: list[str]) -> None:
    """Write the later rows to ``aside``, then the log without them; each atomically. If the log cannot be
    rewritten, ``aside`` is removed again: the rows are still in the log, nowhere twice."""
    with atomic_path(aside) as tmp:
        tmp.write_text("".join(line + "\n" for line in moved))
    try:
        with atomic_path(log) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))
    except OSError:
        aside.unlink(missing_ok=True)
        raise


def _remove_if_empty(folder: Path | None, stop: Path) -> None:
    """Remove ``folder`` and then its parents while they are empty, up to (not including) ``stop``."""
    if folder is None:
        return
    stop = Path(os.path.abspath(stop))
    folder = Path(os.path.abspath(folder))
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()  # only ever an empty folder
        except OSError:
            return
        folder = folder.parent


def _later_rows(path: Path, after_step: int) -> tuple[list[str], list[str]] | None:
    """(rows up to the step, rows after it) of a metrics log, or None when none is after it."""
    if not path.is_file():
        return None
    kept, moved = [], []
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):  # a row cut short by a crash: kept aside, not dropped
            moved.append(line)
            continue
        (kept if step <= after_step else moved).append(line)
    return (kept, moved) if moved else None

