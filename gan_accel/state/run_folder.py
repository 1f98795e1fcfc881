"""The run folder's bookkeeping: which files the run wrote (the manifest) and what it did (the history).

* ``manifest.json``: the run's id and every file or checkpoint folder it wrote, with the step it was
  written at. ``overwrite`` removes exactly these, a branch moves aside exactly those written after
  the branch point, and a file the run did not record is never touched.
* ``history.jsonl``: one dated line per start, resume, branch, fork, overwrite and config change;
  only ever appended to.
* ``.lock``: see :mod:`gan_accel.state.lock`.

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
from .checkpoint import list_checkpoints
from .files import atomic_path
from .layout import (ABANDONED, CHECKPOINT_PREFIX, CHECKPOINTS, CONFIG, FIXED_LABELS, FIXED_NOISE, HISTORY,
                     LEGACY_FIXED_LABELS, LEGACY_FIXED_NOISE, MANIFEST, METRICS, RUN_FILES, RUN_PATTERNS, checkpoint_root,
                     checkpoint_step)
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
        return [name for name in self.manifest["files"] if (self.path / name).exists()]

    def start(self, run_id: str | None = None) -> str:
        """Begin a new manifest (a new run in this folder); returns the run's id."""
        self._manifest = {"run_id": run_id or uuid.uuid4().hex, "files": {}}
        self._save()
        return self._manifest["run_id"]

    def adopt(self, run_id: str | None = None) -> None:
        """A folder without a manifest (written before manifests existed, or it was deleted), being resumed: its
        gan_accel-named files become the run's; ``run_id``: the resumed checkpoint's (a new one if None)."""
        if (self.path / MANIFEST).is_file():
            return
        self._manifest = {"run_id": run_id or uuid.uuid4().hex, "files": {name: 0 for name in self.named_like_ours()}}
        self._save()

    def record(self, path: str | os.PathLike, step: int) -> None:
        """Note that the run wrote ``path`` (inside the folder) at ``step``."""
        if not self.writer:
            return
        self.manifest["files"][self._relative(path)] = int(step)
        self._save()

    def sync_checkpoints(self) -> None:
        """Make the manifest's checkpoint entries the complete checkpoints now in ``checkpoints/``."""
        if not self.writer:
            return
        files = self.manifest["files"]
        current = {self._relative(p): checkpoint_step(p) for p in list_checkpoints(self.path)}
        for name in [n for n in files if n.startswith(f"{CHECKPOINTS}/{CHECKPOINT_PREFIX}") and n not in current]:
            del files[name]
        files.update(current)
        self._save()

    def _relative(self, path: str | os.PathLike) -> str:
        path = Path(path)
        try:
            return path.relative_to(self.path).as_posix()
        except ValueError:  # already relative to the folder
            return path.as_posix()

    def _save(self) -> None:
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
        file = self.path / HISTORY
        return [json.loads(line) for line in file.read_text().splitlines() if line.strip()] if file.is_file() else []

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

    def clear(self) -> list[str]:
        """Remove the recorded files of the previous run (``overwrite``); returns what was removed."""
        removed = []
        for name in self.recorded():
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
            removed.append(name)
        self._manifest = {"run_id": None, "files": {}}
        return removed

    # -- branches ---------------------------------------------------------------------------------
    def move_aside(self, after_step: int) -> tuple[Path, list[str]]:
        """Move what the run wrote after ``after_step`` to ``checkpoints/abandoned/<label>/``.

        Checkpoints, step-stamped samples and final files recorded at a later step move (nothing is
        deleted); metrics rows after the step move to that folder's ``metrics.jsonl``. Returns the
        folder and the moved names (empty when nothing was later).
        """
        files = self.manifest["files"]
        later = sorted(name for name, step in files.items()
                       if step > after_step and not name.startswith(f"{CHECKPOINTS}/{ABANDONED}/")
                       and name != METRICS and (self.path / name).exists())
        rows = _later_rows(self.path / METRICS, after_step)
        if not later and not rows:
            return self.path, []
        dest = checkpoint_root(self.path) / ABANDONED / f"after_step_{after_step}_{time.strftime('%Y%m%d-%H%M%S')}"
        while dest.exists():
            dest = dest.with_name(dest.name + "_")
        dest.mkdir(parents=True)
        for name in later:
            target = dest / Path(name).name
            os.replace(self.path / name, target)
            files[target.relative_to(self.path).as_posix()] = files.pop(name)
        if rows:
            kept, moved = rows
            (dest / METRICS).write_text("".join(line + "\n" for line in moved))
            with atomic_path(self.path / METRICS) as tmp:
                tmp.write_text("".join(line + "\n" for line in kept))
            files[(dest / METRICS).relative_to(self.path).as_posix()] = after_step
            later.append(f"{len(moved)} metrics row(s)")
        self._save()
        return dest, later

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
        self._save()


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


def listing(names: list[str]) -> str:
    """The first names, then how many more: for messages."""
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
