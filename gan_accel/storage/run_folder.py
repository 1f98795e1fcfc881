"""The run folder: one run per folder, and it only moves forward.

A new run starts only in an absent or empty folder (:func:`check_new_run`), or in one whose run was killed before
its first checkpoint (:mod:`gan_accel.storage.restart`); ``resume_from="latest"`` continues it there; any other
checkpoint forks into a new folder. A run deletes only its own pruned checkpoints and sample grids, and what a run
killed before its first checkpoint wrote; ``history.jsonl`` (one dated line per start, resume and fork) is only
appended. A run is refused inside another run's ``checkpoints/`` or ``trackers/`` (:func:`output_dir_refusal`).
Only the main process writes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..errors import RunFolderError
from .files import atomic_path
from .layout import (CHECKPOINTS, CONFIG, FIXED_LABELS, FIXED_NOISE, GENERATOR, HISTORY, LOCK, METRICS, TRACKERS,
                     append_line, checkpoint_root, read_json_lines)
from .restart import KEPT, killed_attempt, killed_refusal
from .safe_tree import load_tree, save_tree

CONTINUE_OR_MOVE = ("continue it with `--resume latest`, or choose another `--output-dir` "
                    "(gan-accel never deletes a run)")


def check_new_run(path: str | os.PathLike) -> None:
    """Refuse, in one line, to start a new run in ``path`` unless it is absent or empty (a ``.lock`` and a
    ``history.jsonl`` alone count as empty: a run stopped before writing anything else), or holds a run killed
    before its first checkpoint, which the same command starts again (:mod:`gan_accel.storage.restart`)."""
    path = Path(path)
    if path.exists() and not path.is_dir():  # a file, a FIFO, a device: no run, and no folder for one either
        raise RunFolderError(f"{path} is a file, not a folder: name a folder for the run's output (absent or empty), "
                             "e.g. beside it")
    if path.exists() and any(p.name not in KEPT for p in path.iterdir()):
        holder = killed_attempt(path)
        if holder is None:
            raise RunFolderError(f"{path} holds a run: {CONTINUE_OR_MOVE}")
        refusal = killed_refusal(path, holder)
        if refusal is not None:
            raise RunFolderError(refusal)


def log_event(path: str | os.PathLike, event: str, **fields: Any) -> None:
    """Append one dated line to the run's ``history.jsonl``."""
    append_line(Path(path) / HISTORY, {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event, **fields})


def read_history(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The history's entries; a line that is not a JSON object (cut short by a crash) is skipped."""
    return read_json_lines(Path(path) / HISTORY)[0]


def write_description(path: str | os.PathLike, config: Any, fixed_latents: Any, fixed_labels: Any = None) -> None:
    """``config.json`` (the config in use now), ``fixed_noise.safetensors`` and, in a conditional run,
    ``fixed_labels.safetensors`` (the progress grids' labels): :func:`read_fixed_latents` reads them back."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with atomic_path(path / CONFIG) as tmp:
        config.to_json(tmp)
    save_tree(fixed_latents, path / FIXED_NOISE)
    if fixed_labels is not None:
        save_tree(fixed_labels, path / FIXED_LABELS)


def read_fixed_latents(run: str | os.PathLike) -> tuple[Any, Any]:
    """(the fixed latents, the fixed labels or None) a run drew for its progress samples, read without running code."""
    run = Path(run)
    if not os.path.lexists(run / FIXED_NOISE):
        raise RunFolderError(f"{run} has no {FIXED_NOISE}: it is written at a run's first step; pass a run folder")
    labels = load_tree(run / FIXED_LABELS) if os.path.lexists(run / FIXED_LABELS) else None
    return load_tree(run / FIXED_NOISE), labels


# -- runs inside runs ---------------------------------------------------------------------------------------
def holds_run(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a gan_accel run: a history, a metrics log, an exported generator or a complete
    checkpoint (a bare ``config.json`` is too common a name to count)."""
    from .checkpoint import list_checkpoints

    folder = Path(folder)
    return folder.is_dir() and (any((folder / name).exists() for name in (HISTORY, METRICS, GENERATOR))
                                or bool(list_checkpoints(folder)))


def managing_run(path: str | os.PathLike) -> tuple[Path, str] | None:
    """``(run folder, "checkpoints" or "trackers")`` when ``path`` (existing or not) lies in, or is, one of
    those folders of a run, which that run writes and prunes; else None. Judged as written and through links."""
    for candidate in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        for folder in (candidate, *candidate.parents):
            if folder.name in (CHECKPOINTS, TRACKERS) and holds_run(folder.parent):
                return folder.parent, folder.name
    return None


# What a run writes into, appends to or keeps open in place: a link standing there would carry the writes
# outside the run (files the run replaces whole are renamed over a link, which replaces the link itself).
WRITTEN_IN_PLACE = (CHECKPOINTS, GENERATOR, TRACKERS, LOCK, HISTORY, METRICS)


def link_inside(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot hold a run (one line with the fix) when a link, or for a file a FIFO, device or folder,
    stands where the run writes in place."""
    for name in WRITTEN_IN_PLACE:
        entry = Path(path) / name
        if entry.is_symlink():
            return (f"{entry} is a symbolic link, and a run never writes through a link (its files would land outside "
                    "the run): remove the link; to keep a run on another disk, put the whole output_dir there (the "
                    "output_dir itself may be a link)")
        if name in (LOCK, HISTORY, METRICS) and entry.exists() and not entry.is_file():
            return f"{entry} is not a regular file (a FIFO, device or folder stands where the run writes): remove it"
    return None


def output_dir_refusal(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be a run's ``output_dir`` (one line with the fix), or None: it lies inside another
    run's ``checkpoints/`` or ``trackers/``, its own ``checkpoints/`` is another run's folder, or a link stands
    where the run writes in place (:data:`WRITTEN_IN_PLACE`)."""
    inside = link_inside(path)
    if inside is not None:
        return inside
    owner = managing_run(path)
    if owner is not None:
        run, area = owner
        return (f"output_dir {path} is inside {run / area}, which belongs to the run in {run}; choose a folder "
                f"outside it, e.g. beside {run}")
    if holds_run(checkpoint_root(path)):
        return f"output_dir {path}: its {CHECKPOINTS}/ folder is itself a run folder; choose another output_dir"
    return None
