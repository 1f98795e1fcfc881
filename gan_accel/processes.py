"""What the processes of a launch agree on: an error one process sees is raised by all (:func:`run_together`,
:func:`raise_together`), no collective waits without bound (:func:`bound_waits`), all leave the group together
(:func:`leave_process_group`), one prints (:func:`is_first_process`), and the exit code of a process whose peer
went silent (:data:`EXIT_SILENT_PEER`). Below storage, data and eval, which agree on errors too."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch.distributed as dist

from . import errors
from .errors import GanAccelError, TrainingInterrupted

T = TypeVar("T")

#: Exit code when another process stopped answering or went away: EX_TEMPFAIL of sysexits.h, "a temporary
#: failure; retry" (resume with ``--resume latest``), unlike 2 (a mistake to fix).
EXIT_SILENT_PEER = 75


def raise_together(accelerator: Any, error: BaseException | None) -> None:
    """Collective: if any process passes an error, every process raises it (the others as the same gan_accel
    class with the same message), so all ranks stop at the same point and print the same line."""
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        report = None if error is None else (type(error).__name__, str(error), accelerator.process_index)
        first = next((r for r in gather_object([report]) if r is not None), None)
        if error is None and first is not None:
            raise rebuild_error(*first)
    if error is not None:
        raise error


def run_together(accelerator: Any, action: Callable[[], T], main_only: bool = False) -> T | None:
    """Run ``action`` (on the main process only with ``main_only``), then :func:`raise_together` its error."""
    result, error = None, None
    if not main_only or accelerator.is_main_process:
        try:
            result = action()
        except Exception as caught:  # reported to every process, re-raised here unchanged
            error = caught
    raise_together(accelerator, error)
    return result


def rebuild_error(class_name: str, message: str, rank: int) -> BaseException:
    """The error another process raised, as the same gan_accel class (else a GanAccelError naming it)."""
    cls = getattr(errors, class_name, None)
    if cls is TrainingInterrupted:
        return TrainingInterrupted(message, 0)
    if isinstance(cls, type) and issubclass(cls, GanAccelError):
        return cls(message)
    return GanAccelError(f"process {rank} failed: {class_name}: {message}")


def bound_waits(seconds: float) -> None:
    """torch's collective timeout becomes ``seconds`` (for an Accelerator the user built)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.set_timeout(timedelta(seconds=seconds))


def leave_process_group() -> None:
    """After success: a barrier, then close the process group on every rank (left to the interpreter's
    exit, a rank that closes its gloo sockets first can make another abort with -6)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def is_first_process() -> bool:
    """Whether this is the first process of a launch (or the only one): it prints the error every process raised."""
    return os.environ.get("RANK", "0") in ("0", "")
