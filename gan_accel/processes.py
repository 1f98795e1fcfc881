"""What the processes of a launch agree on: an error one sees is raised by all (:func:`run_together`), no collective
waits without bound (:func:`bound_waits`), which processes went silent when a collective failed
(:func:`silent_processes`), all leave the group together, one prints. Below storage, data and eval, which use it too."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, TypeVar

import torch.distributed as dist
from accelerate.utils import broadcast_object_list, gather_object

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


def main_decides(accelerator: Any, decide: Callable[[], T]) -> T | None:
    """Collective: ``decide()`` on the main process, its result given to every process (its error raised on all)."""
    choice = [run_together(accelerator, decide, main_only=True)]
    if accelerator.num_processes > 1:
        broadcast_object_list(choice, from_process=0)
    return choice[0]


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


def collective_failure(error: BaseException) -> tuple[bool, bool]:
    """(timed out, gone): how a collective that another process failed (gloo) says so; (False, False) otherwise."""
    text = str(error)
    return (any(m in text for m in ("Timed out waiting", "wait timeout", "Application timeout")),
            any(m in text for m in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")))


def silent_processes(grace: float = 3.0) -> tuple[list[int], bool]:
    """After a collective failed, every live process says so in the rendezvous store: (the ranks silent for
    ``grace`` seconds, whether this process is the first live one and prints); without a group, none."""
    if not (dist.is_available() and dist.is_initialized()):
        return [], is_first_process()
    rank, size = dist.get_rank(), dist.get_world_size()
    key = f"gan_accel/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/failed/"
    try:
        with quiet_stderr():  # a store whose server is gone has torch log a C++ stack trace before it raises
            store = dist.distributed_c10d._get_default_store()
            store.set_timeout(timedelta(seconds=grace))  # its server may be the stopped process
            store.add(f"{key}{rank}", 1)
            deadline = time.monotonic() + grace
            while True:
                silent = [r for r in range(size) if r != rank and not store.check([f"{key}{r}"])]
                if not silent or time.monotonic() > deadline:
                    return silent, all(r in silent for r in range(rank))
                time.sleep(0.1)
    except Exception:  # the store did not answer: its server (process 0, or the launcher's host) is gone
        return [r for r in range(size) if r != rank], True


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """While the block runs, what is written to file descriptor 2 (by C++ code too) goes to /dev/null."""
    sys.stderr.flush()
    try:
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
