"""What the ``gan-accel`` commands share: telling a run folder from a checkpoint (or from neither),
and writing new output files and folders without ever replacing anything.

Every check raises :class:`CommandError` (or another :class:`~gan_accel.errors.GanAccelError`) with
one line naming the problem and the fix; :func:`gan_accel.ending.run_script` prints it as the
``error:`` line (exit 2). The checks only read: nothing is written into a run folder.
"""

from __future__ import annotations

import errno
import os
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, BinaryIO, Callable

from ..errors import GanAccelError
from ..storage.checkpoint import is_complete, list_checkpoints
from ..storage.files import cannot_write, clear_dead_temporaries, create_new, remove_entry, temporary_name
from ..storage.run_folder import managing_run
from ..storage.layout import (CHECKPOINT_PREFIX, CHECKPOINTS, COMPLETE, EXPORT_WEIGHTS, GENERATOR, RUN_FILES, RUN_MARKS,
                            RUN_PATTERNS, TMP_PREFIX, checkpoint_run_folder, checkpoint_step, is_run_folder)

PASS_A_RUN = "pass a run folder (the --output-dir of a training run) or one of its checkpoints/checkpoint_<step> folders"


class CommandError(GanAccelError, ValueError):
    """A ``gan-accel`` argument that names something unusable: a missing or foreign folder, an existing output."""


def _checkpoints_named(run: Path) -> str:
    names = [p.name for p in list_checkpoints(run)]
    return ", ".join(names[-4:]) if names else "none"


def _common_mistakes(path: Path, what: str) -> None:
    """The mistakes any argument naming a run can hold: missing, a file, not a run, a partial checkpoint."""
    if not path.exists():
        raise CommandError(f"{path} does not exist: {what}")
    if not path.is_dir():
        holder = path.parent if is_run_folder(path.parent) or is_complete(path.parent) else None
        fix = f"pass the folder that holds it ({holder})" if holder else what
        raise CommandError(f"{path} is a file, not a run folder or a checkpoint folder: {fix}")
    if path.name.startswith(TMP_PREFIX) or (path.name.startswith(CHECKPOINT_PREFIX) and not (path / COMPLETE).is_file()):
        run = checkpoint_run_folder(path)
        raise CommandError(f"{path} is not a complete checkpoint (no {COMPLETE} marker: still being written, or cut "
                           f"short by a crash): pass a complete one (in {run}: {_checkpoints_named(run)})")
    if path.name == CHECKPOINTS and is_run_folder(path.parent):
        raise CommandError(f"{path} is the folder of a run's checkpoints: pass the run folder {path.parent} or one "
                           f"checkpoint in it ({_checkpoints_named(path.parent)})")


def resolve_source(argument: str | os.PathLike) -> Path:
    """RUN_OR_CHECKPOINT of ``sample``, ``eval`` and ``export``: a run folder or a checkpoint."""
    path = Path(argument)
    _common_mistakes(path, PASS_A_RUN)
    if is_complete(path) or ((path / EXPORT_WEIGHTS).is_file() and not (path / GENERATOR).exists()):
        return path  # a checkpoint, or an export (load_generator checks its config.json)
    if not is_run_folder(path):
        raise CommandError(f"{path} is not a gan_accel run folder (it has none of {', '.join(RUN_MARKS)}): {PASS_A_RUN}")
    if not (path / GENERATOR).is_dir():
        latest = list_checkpoints(path)
        if not latest:
            raise CommandError(f"run {path} has no {GENERATOR}/ (written when training ends) and no complete "
                               "checkpoint yet: there is nothing to sample; let it reach its first checkpoint, or "
                               "resume it (--resume latest)")
        raise CommandError(f"run {path} has no {GENERATOR}/ yet (written when training ends; its latest checkpoint "
                           f"is at step {checkpoint_step(latest[-1])}): pass that checkpoint, {latest[-1]}")
    return path


def resolve_run(argument: str | os.PathLike, command: str) -> Path:
    """RUN of ``info`` and ``plot``: a run folder (a checkpoint is named as such, with its run)."""
    path = Path(argument)
    what = "pass a run folder (the --output-dir of a training run)"
    _common_mistakes(path, what)
    if is_complete(path):
        raise CommandError(f"{path} is a checkpoint: gan-accel {command} takes its run folder, "
                           f"{checkpoint_run_folder(path)}")
    if not is_run_folder(path):
        raise CommandError(f"{path} is not a gan_accel run folder (it has none of {', '.join(RUN_MARKS)}): {what}")
    return path


# -- new outputs -----------------------------------------------------------------------------------
def check_new_output(out: Path, flag: str = "--out") -> None:
    """``out`` can be created: it does not exist, its folder exists and is writable, and it is not in a folder
    a run manages (its ``checkpoints/`` or ``trackers/``, see :mod:`gan_accel.storage.run_folder`). Nothing is made."""
    if os.path.lexists(out):
        kind = "folder" if out.is_dir() else "file"
        raise CommandError(f"{flag} {out}: that {kind} exists, and gan-accel never replaces anything; choose a new "
                           "path (or move the old one away)")
    owner = managing_run(out)
    if owner is not None:  # the run writes and prunes what is there
        raise CommandError(f"{flag} {out}: that is inside {owner[0] / owner[1]}, which belongs to the run in "
                           f"{owner[0]} (it writes and prunes what is there); choose a path outside it")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        raise CommandError(f"{flag} {out}: its folder {parent} does not exist; create it first, or choose another path")
    if not parent.is_dir():
        raise CommandError(f"{flag} {out}: {parent} is not a folder; choose another path")
    if is_run_folder(parent) and (out.name in RUN_FILES or any(fnmatch(out.name, p) for p in RUN_PATTERNS)):
        raise CommandError(f"{flag} {out}: that name is one of the run's own in its folder, which the run may replace "
                           "or prune; choose another name or folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CommandError(f"{flag} {out}: cannot write in {parent}: Permission denied (EACCES); choose a folder "
                           "you can write to")
    probe = temporary_name(out)  # a real write, now, not after the work: os.access says yes to root anywhere
    try:
        remove_entry(probe)  # this process id's name: a leftover or a link goes as a name, never followed
        os.close(create_new(probe, 0o600))
        os.unlink(probe)
    except OSError as error:
        raise cannot_write(out, error, flag) from None


def write_new_file(out: Path, data: bytes, flag: str = "--out") -> None:
    """Write ``data`` to a new file ``out``: whole or not at all, and never over an existing file.

    The bytes go to a temporary file beside it first, which is then hard-linked to ``out`` (a link
    fails if ``out`` appeared meanwhile, where a rename would replace it).
    """
    write_new_file_with(out, lambda handle: handle.write(data), flag)


def write_new_file_with(out: Path, write: Callable[[BinaryIO], Any], flag: str = "--out") -> None:
    """:func:`write_new_file` of what ``write(handle)`` writes, as it goes (a file larger than memory)."""
    tmp = temporary_name(out)
    try:
        clear_dead_temporaries(out)  # what a killed earlier try of this command left
        remove_entry(tmp)  # this process id's name: a leftover or a link goes as a name, never followed
        _write_new_file(out, tmp, write, flag)
    except OSError as error:
        raise cannot_write(out, error, flag) from error
    finally:
        tmp.unlink(missing_ok=True)


def _write_new_file(out: Path, tmp: Path, write: Callable[[BinaryIO], Any], flag: str) -> None:
    with open(tmp, "xb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise CommandError(f"{flag} {out} was created by something else meanwhile; nothing was written over it") \
            from None
    except OSError as error:  # a file system without hard links
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        if os.path.lexists(out):
            raise CommandError(f"{flag} {out} was created by something else meanwhile; nothing was written over "
                               "it") from None
        os.replace(tmp, out)
