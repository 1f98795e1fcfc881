"""A run killed before its first complete checkpoint (SIGKILL, out of memory, a lost node) starts again in its
folder with the same command: nothing of it can be resumed, and what it wrote is replaced.

Only a folder whose lock names a holder that is gone, with no complete checkpoint, and whose every entry is one
such a run writes qualifies. Replaced: ``config.json``, ``data.json`` and the other records, the progress samples,
``metrics.jsonl``, ``health.json``, the plot, ``trackers/`` and an unfinished checkpoint's temporary; removed as
names, never through a link. Kept: ``history.jsonl``, which records the killed attempt and the restart. Anything
else (a file the run did not write, a link, a complete checkpoint, ``generator/``) keeps the folder refused.
"""

from __future__ import annotations

import os
import stat
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from .files import remove_tree
from .layout import CHECKPOINTS, GENERATOR, HISTORY, LOCK, RUN_FILES, TMP_PREFIX, TRACKERS
from .lock import recorded_holder

REPLACED = frozenset(RUN_FILES) - {GENERATOR}  # generator/ is written at a run's end, after a checkpoint
SAMPLES = ("samples_*.png", "samples_*.pt")
KEPT = (LOCK, HISTORY)


def written_by_attempt(entry: Path) -> bool:
    """Whether ``entry`` (a name in the run folder) is one a run writes before its first checkpoint, of the kind
    it writes (a link or a FIFO under such a name was not written by it)."""
    try:
        mode = os.lstat(entry).st_mode
    except OSError:
        return False
    name = entry.name
    if name == CHECKPOINTS:  # only unfinished checkpoints (.tmp-checkpoint_<step>)
        return stat.S_ISDIR(mode) and all(child.name.startswith(TMP_PREFIX) for child in entry.iterdir())
    if name == TRACKERS:
        return stat.S_ISDIR(mode)
    written = any(fnmatch(name, p) or fnmatch(name, f".{p}.*.tmp") for p in (*REPLACED, *SAMPLES))  # or its temporary
    return written and stat.S_ISREG(mode)


def attempt_entries(folder: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """(the entries of ``folder`` a run writes before its first checkpoint, the others), ``.lock`` and
    ``history.jsonl`` aside."""
    entries = sorted(p for p in Path(folder).iterdir() if p.name not in KEPT)
    return [p for p in entries if written_by_attempt(p)], [p for p in entries if not written_by_attempt(p)]


def killed_attempt(folder: str | os.PathLike, holder: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The lock record of the run in ``folder`` when that run was killed before its first complete checkpoint:
    ``holder`` (the record :class:`~gan_accel.storage.lock.RunLock` found, its holder certainly gone), else the
    record read from ``.lock`` when its process no longer runs or runs on another host (decided again under the
    lock). None when the folder holds a complete checkpoint or its holder runs here."""
    from .checkpoint import list_checkpoints

    if holder is None:
        holder = recorded_holder(folder)
        if holder is None or holder.get("alive"):
            return None
    return None if list_checkpoints(folder) else holder


def killed_refusal(folder: Path, holder: dict[str, Any]) -> str | None:
    """Why the killed run in ``folder`` cannot start again there (an entry it did not write), or None."""
    others = attempt_entries(folder)[1]
    if not others:
        return None
    names = name_some([p.name for p in others])
    return (f"{folder} holds a run killed before its first checkpoint (pid {holder.get('pid')} on {holder.get('host')})"
            f", and {names}, which that run did not write: move {'it' if len(others) == 1 else 'them'} away, and the "
            "same command starts the run again there")


def clear_killed_attempt(folder: Path, holder: dict[str, Any] | None) -> list[str]:
    """Main process, under the lock: when ``folder`` holds a run killed before its first checkpoint (``holder``,
    the record the lock found), remove what that run wrote; returns the names removed (empty: nothing done)."""
    holder = killed_attempt(folder, holder) if holder else None
    if holder is None or killed_refusal(folder, holder) is not None:
        return []
    removed = attempt_entries(folder)[0]
    for entry in removed:
        remove_tree(entry)  # a name, never through a link (checked: none of these is one)
    return [p.name for p in removed]


def name_some(names: list[str], shown: int = 3) -> str:
    """``a, b, c and 4 more``: a list of names short enough for one line."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
