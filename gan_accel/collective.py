"""Errors that every process agrees on: one process failing must never leave the others waiting."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from . import errors

T = TypeVar("T")


def raise_together(accelerator: Any, error: BaseException | None) -> None:
    """Collective (call on every process): if any process passes an error, every process raises.

    The failing process raises its own error; the others raise one of the same gan_accel class with
    the same message, so all ranks stop at the same point and print the same line.
    """
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
    if isinstance(cls, type) and issubclass(cls, errors.GanAccelError) and cls is not errors.TrainingInterrupted:
        return cls(message)
    if cls is errors.TrainingInterrupted:
        return errors.TrainingInterrupted(message, 0)
    return errors.GanAccelError(f"process {rank} failed: {class_name}: {message}")


def leave_process_group() -> None:
    """End of a successful multi-process script: a barrier, then close the process group on every rank.

    Without it the interpreter tears the gloo group down at exit; a rank that gets there first can
    close its sockets while another's gloo threads still hold work, and that rank aborts ("terminate
    called without an active exception", exit -6) after all its work was done and saved. A no-op
    when no process group was started. Only after success: after an error a rank may be stuck in a
    collective, and a barrier would hang it.
    """
    import torch.distributed as dist

    from .watchdog import stop_watchdog

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        stop_watchdog()  # after the barrier: every rank got there, none may be reported silent for leaving
        dist.destroy_process_group()
