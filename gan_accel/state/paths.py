"""Which paths a run may remove or move, and which folders belong to a run.

Two rules, checked before anything is removed, moved or written:

* **Containment** (:func:`refusal`): a path read from a file (a ``manifest.json`` entry) is removed
  or moved only if it names something *inside* the run folder: relative, without ``..``, not the
  folder itself nor its bookkeeping (``manifest.json``, ``history.jsonl``, ``.lock``, the
  ``checkpoints/`` and ``checkpoints/abandoned/`` folders themselves), and with no symbolic link on
  the way (the run never writes links, so a link there was put by someone else, and following it
  could reach anything). One link is followed: ``checkpoints/`` itself, which users point at another
  disk; it is the run's own checkpoints folder wherever it lies.
* **Ownership** (:func:`managing_run`): a run prunes and moves what is in its ``checkpoints/`` and
  removes its ``trackers/``; a folder there belongs to that run. A new run folder (``output_dir``) or
  a ``gan-accel ... --out`` inside them is refused, naming the run.

Both resolve links (``os.path.realpath``), so a link into another run's folder is judged by where it
leads.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from .layout import (ABANDONED, CHECKPOINT_PREFIX, CHECKPOINTS, COMPLETE, GENERATOR, HISTORY, LOCK, MANIFEST,
                     METRICS, TRACKERS)

# Never removed or moved by a manifest entry: the run's bookkeeping and the folders that hold checkpoints.
PROTECTED = (MANIFEST, HISTORY, LOCK, CHECKPOINTS, f"{CHECKPOINTS}/{ABANDONED}")
# The folders of a run that the run itself prunes, moves or removes as a whole.
MANAGED = (CHECKPOINTS, TRACKERS)


def refusal(root: str | os.PathLike, name: str) -> str | None:
    """Why the manifest entry ``name`` must not be removed or moved from the run folder ``root``, in words
    (``"goes up out of the run folder with '..'"``), or None when it names something inside it."""
    text = str(name)
    pure = PurePosixPath(text)
    if pure.is_absolute() or PureWindowsPath(text).drive or PureWindowsPath(text).root:
        return "is an absolute path"
    if ".." in pure.parts or ".." in PureWindowsPath(text).parts:
        return "goes up out of the run folder with '..'"
    parts = [part for part in pure.parts if part != "."]
    if not parts:
        return "names the run folder itself"
    if "/".join(parts) in PROTECTED:
        return f"is the run's own {'/'.join(parts)} (never removed by a manifest entry)"
    base = Path(root)
    if parts[0] == CHECKPOINTS and len(parts) > 1:  # checkpoints/ may be a link to another disk: the run's own
        base, parts = base / CHECKPOINTS, parts[1:]
    base = Path(os.path.realpath(base))
    current = base
    for index, part in enumerate(parts):
        current = current / part
        if current.is_symlink():
            where = "it is" if index == len(parts) - 1 else f"a folder on its way ({part}) is"
            return f"{where} a symbolic link (to {os.readlink(current)}), which the run never writes"
    if not _within(Path(os.path.realpath(current)), base):  # cannot happen after the checks above; kept as a guard
        return f"resolves outside the run folder (to {os.path.realpath(current)})"
    return None


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def holds_run(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a gan_accel run: a manifest, a history, a metrics log, an exported generator or a
    complete checkpoint (a bare ``config.json`` is too common a name to count)."""
    folder = Path(folder)
    if not folder.is_dir():
        return False
    if any((folder / name).is_file() for name in (MANIFEST, HISTORY, METRICS, GENERATOR)):
        return True
    checkpoints = folder / CHECKPOINTS
    try:
        return checkpoints.is_dir() and any(p.name.startswith(CHECKPOINT_PREFIX) and (p / COMPLETE).is_file()
                                            for p in checkpoints.iterdir())
    except OSError:
        return False


def managing_run(path: str | os.PathLike) -> tuple[Path, str] | None:
    """``(run folder, "checkpoints" or "trackers")`` when ``path`` (existing or not) lies in, or is, a folder a
    run manages; else None. Judged on the path as written and on where its links lead."""
    written = Path(os.path.abspath(path))
    resolved = Path(os.path.realpath(path))
    for candidate in (written, resolved):
        for folder in (candidate, *candidate.parents):
            if folder.name in MANAGED and holds_run(folder.parent):
                return folder.parent, folder.name
    return None


def output_dir_refusal(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be a run's ``output_dir`` (one line with the fix), or None.

    Refused: a folder inside (or equal to) another run's ``checkpoints/`` or ``trackers/``, which that run
    prunes, moves aside or removes; and a folder whose own ``checkpoints/`` or ``trackers/`` is already a
    run folder, which this run would write into and prune. A run folder inside another run's folder
    elsewhere is allowed: a run only ever touches the files it recorded, by name.
    """
    owner = managing_run(path)
    if owner is not None:
        run, area = owner
        what = "prunes its checkpoints there and moves them aside" if area == CHECKPOINTS else "removes it with the run"
        return (f"output_dir {path} is inside {run / area}, which the run in {run} manages (it {what}), so this run "
                f"could be deleted by it; choose a folder outside {run / area}, e.g. beside {run}")
    for area in MANAGED:
        inner = Path(path) / area
        if holds_run(inner):
            return (f"output_dir {path}: its {area}/ folder is itself a run folder ({inner}), which this run would "
                    "write into and prune; move that run away or choose another output_dir")
    return None
