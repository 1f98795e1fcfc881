"""What this process has done so far, so that the line printed when it ends says what is true.

The trainer registers itself here when it is built (:func:`track_run`); the watchdog and
:func:`gan_accel.scripts.run_script` ask :func:`where` and :func:`checkpoint_note` when a signal or a
silent peer ends the process, instead of guessing (a ``KeyboardInterrupt`` used to be reported as
"before training started; nothing was written" even after hundreds of checkpointed steps).

:func:`claim_ending` is a once-only latch: the first part of the process that decides to end it
(the main thread after an interruption, or the watchdog thread) prints the one line; the other stays
quiet.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_lock = threading.Lock()
_trainer: "weakref.ReferenceType[Any] | None" = None
_ending = False


def track_run(trainer: Any) -> None:
    """Make ``trainer`` the run this process reports on (the newest one built)."""
    global _trainer
    _trainer = weakref.ref(trainer)


def current_run() -> Any:
    """The tracked trainer, or None."""
    return _trainer() if _trainer is not None else None


def training_started() -> bool:
    trainer = current_run()
    return trainer is not None and (getattr(trainer, "fit_calls", 0) > 0 or getattr(trainer, "step", 0) > 0)


def where() -> str:
    """``"at step 180"``, or ``"before training started"``."""
    trainer = current_run()
    return f"at step {trainer.step}" if training_started() else "before training started"


def checkpoint_note() -> str:
    """Where the run can be resumed from (the trainer's own note), or that this launch wrote no checkpoint."""
    trainer = current_run()
    if trainer is not None and training_started():
        return trainer.checkpoint_note()
    if trainer is not None and getattr(trainer, "last_checkpoint", None) is not None:
        return trainer.checkpoint_note()
    return "This launch wrote no checkpoint (the checkpoints of earlier launches, if any, are untouched)."


def interrupted_line(how: str) -> str:
    """The line for an interruption that did not finish the graceful stop, e.g. ``how="interrupted (Ctrl-C)"``."""
    return f"{how} {where()}; {checkpoint_note()}"


def claim_ending() -> bool:
    """True for the first caller only: that caller prints why the process ends."""
    global _ending
    with _lock:
        first, _ending = not _ending, True
        return first


def ending_claimed() -> bool:
    return _ending


def reset() -> None:
    """Forget the tracked run and the latch (tests that run several launches in one process)."""
    global _trainer, _ending
    with _lock:
        _trainer, _ending = None, False
