"""The run folder's bookkeeping: which files the run wrote (the manifest) and what it did (the history).

* ``manifest.json``: the run's id and every file or checkpoint folder it wrote, with the step it was
  written at. ``overwrite`` removes exactly these, a branch moves aside exactly those written after
  the branch point, and a file the run did not record is never touched. An entry is acted on only
  if it names something inside the folder (:func:`gan_accel.state.paths.refusal`: no ``..``, no
  absolute path, no link, not the bookkeeping); any other entry is left alone and named in one line.
* ``history.jsonl``: one dated line per start, resume, branch, fork, overwrite and config change;
  only ever appended to.
* ``.lock``: see :mod:`gan_accel.state.lock`.

Appended files (``metrics.jsonl``, ``history.jsonl``) are read tolerantly; when a run opens the
folder, a last line cut short by a crash is repaired once (:meth:`RunFolder.repair_tails`), its
bytes kept in ``<name>.torn``. A branch's moves are planned in the manifest first and recorded one by
one, so a failure (a full disk) leaves every moved file recorded and the same resume finishes the move.

Only the main process writes these files; the others only read.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import PreflightError, RunFolderError
from .checkpoint import discard_checkpoint, list_checkpoints, written_by
from .branch import move_aside
from .files import atomic_path
from .layout import (CHECKPOINT_PREFIX, CHECKPOINTS, CONFIG, FIXED_LABELS, FIXED_NOISE, HISTORY, LEGACY_FIXED_LABELS,
                     LEGACY_FIXED_NOISE, MANIFEST, METRICS, RUN_FILES, RUN_PATTERNS, TORN_SUFFIX, checkpoint_step)
from .paths import refusal
from .pickles import load_pickle
from .safe_tree import load_tree, save_tree

_SHOWN = 6  # files named in a message before "and N more"


class RunFolder:
    """The manifest and history of one run folder. ``writer``: this process writes them (the main one)."""

    def __init__(self, path: str | os.PathLike, writer: bool) -> None:
        self.path = Path(path)
        self.writer = writer
        self._manifest: dict[str, Any] | None = None

    # -- the manifest -----------------------------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        """``{"run_id": str | None, "files": {relative path: step written}}`` (empty when there is none)."""
        if self._manifest is None:
            file = self.path / MANIFEST
            try:
                self._manifest = json.loads(file.read_text()) if file.is_file() else {"run_id": None, "files": {}}
            except ValueError as error:
                raise RunFolderError(f"{file} is not valid JSON ({error}): it lists the files this run wrote; "
                                     "restore it, or move the run folder's files away and start again") from None
        return self._manifest

    @property
    def run_id(self) -> str | None:
        return self.manifest.get("run_id")

    def recorded(self) -> list[str]:
        """The run's recorded files that still exist, relative to the folder."""
        return [name for name in self.manifest["files"] if os.path.lexists(self.path / name)]

    def start(self, run_id: str | None = None) -> str:
        """Begin a new manifest (a new run in this folder); returns the run's id."""
        self._manifest = {"run_id": run_id or uuid.uuid4().hex, "files": {}}
        self.save()
        return self._manifest["run_id"]

    def adopt(self, run_id: str | None = None) -> None:
        """A folder without a manifest (written before manifests existed, or it was deleted), being resumed: its
        gan_accel-named files become the run's; ``run_id``: the resumed checkpoint's (a new one if None)."""
        if (self.path / MANIFEST).is_file():
            return
        self._manifest = {"run_id": run_id or uuid.uuid4().hex, "files": {name: 0 for name in self.named_like_ours()}}
        self.save()

    def record(self, path: str | os.PathLike, step: int) -> None:
        """Note that the run wrote ``path`` (inside the folder) at ``step``; a path outside it is not recorded
        (a run only ever removes or moves what lies in its folder), and one line says so."""
        if not self.writer:
            return
        name = self.relative(path)
        why = refusal(self.path, name)
        if why is not None:
            print(f"gan_accel: {path} is not recorded as a file of the run in {self.path}: it {why}; a run "
                  "removes and moves only files inside its folder")
            return
        self.manifest["files"][name] = int(step)
        self.save()

    def discard(self, path: str | os.PathLike) -> bool:
        """Remove a file the run recorded (e.g. a pruned sample grid) with its manifest entry; a file the run
        did not record, or one outside the folder, stays. Returns whether it was removed."""
        if not self.writer:
            return False
        name = self.relative(path)
        target = self.path / name
        if name not in self.manifest["files"] or refusal(self.path, name) is not None or target.is_dir():
            return False
        target.unlink(missing_ok=True)
        del self.manifest["files"][name]
        self.save()
        return True

    def sync_checkpoints(self) -> None:
        """Make the manifest's checkpoint entries the complete checkpoints of this run now in ``checkpoints/``
        (one another run wrote, copied or linked there, is not this run's)."""
        if not self.writer:
            return
        files = self.manifest["files"]
        current = {self.relative(p): checkpoint_step(p) for p in list_checkpoints(self.path)
                   if written_by(p, self.run_id)}
        for name in [n for n in files if n.startswith(f"{CHECKPOINTS}/{CHECKPOINT_PREFIX}") and n not in current]:
            del files[name]
        files.update(current)
        self.save()

    def relative(self, path: str | os.PathLike) -> str:
        path = Path(path)
        for inner, outer in ((path, self.path), (Path(os.path.abspath(path)), Path(os.path.abspath(self.path)))):
            try:
                return inner.relative_to(outer).as_posix()
            except ValueError:
                pass
        return path.as_posix()  # already relative to the folder (or outside it: refused where it matters)

    def save(self) -> None:
        if self.writer:
            with atomic_path(self.path / MANIFEST) as tmp:
                tmp.write_text(json.dumps(self.manifest, indent=1, sort_keys=True) + "\n")

    # -- the history ------------------------------------------------------------------------------
    def log_event(self, event: str, **fields: Any) -> None:
        """Append one dated line to ``history.jsonl``."""
        if not self.writer:
            return
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event, **fields}
        with open(self.path / HISTORY, "a") as handle:
            handle.write(json.dumps(entry, sort_keys=True, default=str) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def history(self) -> list[dict[str, Any]]:
        """The history's entries; a line that is not JSON (cut short by a crash) is skipped."""
        file = self.path / HISTORY
        entries = []
        for line in file.read_text().splitlines() if file.is_file() else []:
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        return entries

    # -- appended files cut short ---------------------------------------------------------------------
    def repair_tails(self) -> list[str]:
        """Main process, when a run opens the folder: repair ``metrics.jsonl`` and ``history.jsonl`` if a crash
        cut their last line short, once, so the next appended line is not glued to it.

        A last line that is whole JSON gets its newline; otherwise its bytes move to ``<name>.torn``
        (appended, kept; ``metrics.jsonl.torn`` is recorded as the run's file) and the file ends at its
        last whole line. Each repair prints one line and is logged in the history. Returns those lines.
        """
        if not self.writer:
            return []
        notes = []
        for name in (METRICS, HISTORY):
            if (self.path / name).is_symlink():  # never written through a link
                continue
            kind, size = repair_torn_tail(self.path / name, self.path / f"{name}{TORN_SUFFIX}")
            if kind == "newline":
                notes.append(f"{name} ended without its last newline (a crash while it was written): added it")
            elif kind == "torn":
                notes.append(f"{name} ended in a line cut short by a crash ({size} bytes): kept them in "
                             f"{name}{TORN_SUFFIX} and removed them from {name}, which goes on from its last whole line")
                if name == METRICS:
                    self.manifest["files"].setdefault(f"{name}{TORN_SUFFIX}", 0)
                    self.save()
        for note in notes:
            print(f"gan_accel: {note}")
            self.log_event("repair", note=note)
        return notes

    # -- starting a run here ------------------------------------------------------------------------
    def named_like_ours(self) -> list[str]:
        """Files and checkpoint folders here whose names gan_accel writes."""
        found = [name for name in RUN_FILES if (self.path / name).exists()]
        for pattern in RUN_PATTERNS:
            found += sorted(p.relative_to(self.path).as_posix() for p in self.path.glob(pattern))
        return found

    def check_new_run(self, overwrite: bool) -> None:
        """Refuse to start a run over another one, or (with ``overwrite``) over files no run recorded."""
        if not self.path.is_dir():
            return
        ours = set(self.recorded())
        foreign = [name for name in self.named_like_ours() if name not in ours]
        if not overwrite and (ours or foreign):
            checkpoints = list_checkpoints(self.path)
            held = listing(sorted(ours | set(foreign)))
            if checkpoints:
                raise PreflightError(
                    f"output folder {self.path} already holds a run ({held}; latest checkpoint at step "
                    f"{checkpoint_step(checkpoints[-1])}): resume it (resume_from='latest', --resume latest), replace "
                    "it (overwrite=True, --overwrite: removes only the files that run wrote), or choose another output_dir")
            raise PreflightError(
                f"output folder {self.path} holds a run that stopped before its first checkpoint ({held}): there is "
                "nothing to resume; replace it (overwrite=True, --overwrite: removes only the files that run wrote) "
                "or choose another output_dir")
        if overwrite and foreign:
            raise PreflightError(
                f"output folder {self.path} holds files named like a run's that no gan_accel run recorded as its own "
                f"({listing(foreign)}): overwrite only removes a run's recorded files, so these would be mixed into "
                "the new run; move them away or choose another output_dir")

    def clear(self) -> tuple[list[str], list[str]]:
        """Remove the recorded files of the previous run (``overwrite``): returns (removed, refused).

        An entry that does not name something inside the folder (see :func:`~gan_accel.state.paths.refusal`)
        is never touched: it is returned as ``"name (why)"``. A checkpoint folder loses only the files it
        wrote; anything else in it stays (see :func:`~gan_accel.state.checkpoint.discard_checkpoint`).
        """
        removed, refused = [], []
        for name in self.recorded():
            why = refusal(self.path, name)
            if why is not None:
                refused.append(f"{name} ({why})")
                continue
            target = self.path / name
            if name.startswith(f"{CHECKPOINTS}/") and target.name.startswith(CHECKPOINT_PREFIX) and target.is_dir():
                kept = discard_checkpoint(target)  # only the files the checkpoint wrote
                if kept:
                    refused.append(f"{name} (holds files the checkpoint did not write: {listing(kept)}; they stay)")
            elif target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
            removed.append(name)
        self._manifest = {"run_id": None, "files": {}}
        return removed, refused

    # -- branches ---------------------------------------------------------------------------------
    def move_aside(self, after_step: int) -> tuple[Path, list[str]]:
        """Move what the run wrote after ``after_step`` to ``checkpoints/abandoned/<label>/`` (see
        :func:`gan_accel.state.branch.move_aside`); returns the folder and the moved names."""
        return move_aside(self, after_step)

    def write_description(self, config: Any, fixed_latents: Any, step: int, fixed_labels: Any = None) -> None:
        """``config.json`` (the config in use now; its changes are in the history), ``fixed_noise.safetensors``
        and, in a conditional run, ``fixed_labels.safetensors`` (the progress grids' labels): safe trees
        (:func:`read_fixed_latents` reads them back)."""
        if not self.writer:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path / CONFIG) as tmp:
            config.to_json(tmp)
        save_tree(fixed_latents, self.path / FIXED_NOISE)
        names = [CONFIG, FIXED_NOISE]
        if fixed_labels is not None:
            save_tree(fixed_labels, self.path / FIXED_LABELS)
            names.append(FIXED_LABELS)
        for name in names:
            self.manifest["files"].setdefault(name, step)
        self.manifest["files"].setdefault(METRICS, step)
        self.save()


def read_fixed_latents(run: str | os.PathLike) -> tuple[Any, Any]:
    """(the fixed latents, the fixed labels or None) a run drew for its progress samples, read without running
    code: ``fixed_noise.safetensors``, or a run written before it's ``fixed_noise.pt`` (``weights_only=True``)."""
    run = Path(run)
    found = []
    for name, legacy in ((FIXED_NOISE, LEGACY_FIXED_NOISE), (FIXED_LABELS, LEGACY_FIXED_LABELS)):
        if os.path.lexists(run / name):
            found.append(load_tree(run / name))
        elif os.path.lexists(run / legacy):
            found.append(load_pickle(run / legacy))
        elif name == FIXED_NOISE:
            raise RunFolderError(f"{run} has no {FIXED_NOISE}: it is written at a run's first step; pass a run folder")
        else:
            found.append(None)
    return found[0], found[1]


def repair_torn_tail(path: Path, side: Path) -> tuple[str | None, int]:
    """If the appended file ``path`` ends in a line without its newline: ``("newline", 1)`` when that line is
    whole JSON (the newline is added), else ``("torn", bytes)``: its bytes are appended to ``side`` (flushed to
    disk first, so a crash in between loses nothing) and cut from ``path``. ``(None, 0)``: nothing to repair."""
    try:
        handle = open(path, "rb+")
    except FileNotFoundError:
        return None, 0
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return None, 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return None, 0
        start, end = 0, size
        while end > 0:  # the last newline, read backwards in chunks (the log may be long)
            begin = max(0, end - 65536)
            handle.seek(begin)
            found = handle.read(end - begin).rfind(b"\n")
            if found >= 0:
                start = begin + found + 1
                break
            end = begin
        handle.seek(start)
        tail = handle.read()
        try:
            json.loads(tail)
            whole = True
        except ValueError:
            whole = False
        if whole:
            handle.seek(size)
            handle.write(b"\n")
        else:
            with open(side, "ab") as kept:
                kept.write(tail + b"\n")
                kept.flush()
                os.fsync(kept.fileno())
            handle.truncate(start)
        handle.flush()
        os.fsync(handle.fileno())
    return ("newline", 1) if whole else ("torn", len(tail))










def listing(names: list[str]) -> str:
    """The first names, then how many more: for messages."""
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
