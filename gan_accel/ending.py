"""How a run ends: one line that says what is true, and a clean stop on a signal or at the time limit.

:func:`run_script` is the entry point of the examples and ``gan-accel``: each expected ending is one line, and a
collective that a stopped, hung or dead process failed names that process. :class:`SignalHandler` has every process
stop at the same step with a checkpoint (what the processes agree on otherwise: :mod:`gan_accel.processes`).
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from .errors import GanAccelError, TrainingInterrupted
from .processes import (EXIT_SILENT_PEER, collective_failure, is_first_process, leave_process_group,
                        silent_processes)
from .text import printable

if TYPE_CHECKING:
    from .engine.trainer import GANTrainer

SIGPIPE_EXIT = 128 + 13  # what a shell reports for a command that SIGPIPE ended (cat, grep, git | head)

#: Two deliveries of a stop signal closer than this (seconds) are one request: launchers deliver a
#: terminal's Ctrl-C again within milliseconds (forwarding it, or following it with SIGTERM).
DUPLICATE_SIGNAL_WINDOW = 0.25
#: The stop code of ``max_time``, agreed like a signal number; below SIGINT's and SIGTERM's, so a signal wins.
TIME_LIMIT = 1

UNKNOWN_PROGRESS = "outside training; the complete checkpoints written so far, if any, are untouched."


# -- stop signals ------------------------------------------------------------------------------------
class StopFlag:
    """Set by the signal handler; read by the loop at step boundaries."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0  # time.monotonic() of the signal

    def __bool__(self) -> bool:
        return self.signum is not None


@contextmanager
def stop_on_signals(flag: StopFlag, signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[StopFlag]:
    """Install handlers that only set ``flag``; a second signal (not a duplicate delivery) interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield flag  # handlers can only be installed from the main thread
        return
    previous = {s: signal.getsignal(s) for s in signums}

    def handler(signum: int, frame: Any) -> None:
        if flag:
            if time.monotonic() - flag.at < DUPLICATE_SIGNAL_WINDOW:
                return
            signal.signal(signum, previous[signum])
            raise KeyboardInterrupt(signal.Signals(signum).name)
        flag.signum, flag.at = signum, time.monotonic()

    for s in signums:
        signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def interrupt_on_signals(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM alike raise ``KeyboardInterrupt`` named after the signal, so that
    every stage outside training (scan, cache build, export, evaluation) unwinds through its ``finally`` blocks
    (temporaries removed) and :func:`run_script` prints one line; without it SIGTERM ends the process on the spot,
    leaving them. A signal ignored (``nohup``, a background job) stays ignored; a duplicate delivery within
    :data:`DUPLICATE_SIGNAL_WINDOW` (a launcher forwarding it) is one request, so it cannot cut short that clean-up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signums}
    last = [-1.0]

    def handler(signum: int, frame: Any) -> None:
        now = time.monotonic()
        if now - last[0] < DUPLICATE_SIGNAL_WINDOW:
            return
        last[0] = now
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for s, h in previous.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class SignalHandler:
    """The built-in callback ``signal_handler``: SIGINT/SIGTERM become a checkpoint and a clean stop.

    Processes agree one step late, without a blocking wait: each step starts an all-reduce (max) of the
    local signal number and reads the one started a step earlier, which finished long ago.
    """

    name = "signal_handler"

    def __init__(self) -> None:
        self.flag = StopFlag()
        self.deadline: float | None = None  # time.monotonic() of max_time
        self._handlers: Any = None
        self._pending: tuple[Any, torch.Tensor, Any] | None = None  # (work to wait, value to read, event)

    def on_fit_start(self, trainer: "GANTrainer") -> None:
        self.flag, self._pending = StopFlag(), None
        max_time = trainer.config.max_time  # counted from this fit(): a resume gets the whole time again
        self.deadline = None if max_time is None else time.monotonic() + max_time
        self._handlers = stop_on_signals(self.flag)
        self._handlers.__enter__()

    def on_step_end(self, trainer: "GANTrainer") -> None:
        signum = self.flag.signum or (TIME_LIMIT if self.deadline and time.monotonic() >= self.deadline else 0)
        if trainer.accelerator.num_processes > 1:  # every rank stops at the same step, by the signal one got
            signum = self._agree(signum, trainer.accelerator.device)
        if signum:
            trainer.control.stop(signum)

    def _agree(self, signum: int, device: torch.device) -> int:
        """The largest signal number any rank passed at the previous step; starts this step's exchange."""
        agreed = 0
        if self._pending is not None:
            work, value, event = self._pending
            if work is not None:
                work.wait()
            if event is not None:
                event.synchronize()  # recorded a step ago: waits for nothing queued since
            agreed = int(value.item())
        value = torch.full((1,), float(signum), device=device)  # a fill on the device, no copy
        work = torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, async_op=True)
        if device.type == "cuda":
            work.wait()  # NCCL: the current stream waits for the collective, the host does not
            host = torch.empty(1, pin_memory=True)
            host.copy_(value, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (None, host, event)
        else:  # gloo runs it in the background: wait for it at the next step
            self._pending = (work, value, None)
        return agreed

    def on_close(self, trainer: "GANTrainer") -> None:
        self._pending = None  # an exchange still running completes on its own (every rank started it)
        if self._handlers is not None:
            self._handlers.__exit__(None, None, None)
            self._handlers = None


# -- what the line says ------------------------------------------------------------------------------
def _progress(error: BaseException) -> str:
    return getattr(error, "gan_accel_progress", UNKNOWN_PROGRESS)  # written by fit (engine/trainer.py)


def describe_collective_failure(error: BaseException) -> tuple[str, bool] | None:
    """(one line, whether this process prints it) for a collective another process failed (gloo), else None."""
    text = str(error)
    timed_out, gone = collective_failure(error)
    if not (timed_out or gone):
        return None
    silent, prints = silent_processes()
    many = len(silent) > 1
    names = f"process{'es' if many else ''} {', '.join(map(str, silent))}" if silent else "another process"
    if timed_out:
        waited = re.search(r"waiting (\d+) ?ms", text)  # gloo: "Timed out waiting 120000ms for recv ..."
        seconds = int(waited.group(1)) / 1000 if waited else getattr(error, "gan_accel_timeout", None)
        seconds = "" if seconds is None else f" for {seconds:.0f} s"
        why = (f"{names} {'have' if many else 'has'} not answered{seconds} (stopped, hung or dead; "
               "raise --collective-timeout if one process works alone longer than that)")
    else:
        why = f"{names} ended or lost {'their' if many else 'its'} connection"
    return f"{why}; stopping {_progress(error)}", prints


def describe(error: BaseException) -> str | None:
    """The one line for an expected failure, or None for a bug (which keeps its traceback)."""
    if isinstance(error, GanAccelError):
        return str(error)
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        reason = f"{os.strerror(error.errno)} ({errno.errorcode.get(error.errno, error.errno)})" if error.errno \
            else str(error)
        return f"{where}{reason}; check the path, its permissions and the free space"
    return None


# -- the entry point ---------------------------------------------------------------------------------
def run_script(body: Callable[[], int], debug: bool = False) -> int:
    """Run a script's body; returns its exit code. Each expected ending is one line, from one process: an
    expected failure exit 2; a stop on a signal 128 + the signal; another process silent or gone exit 75;
    a closed pipe (``| head``) quietly 141. A traceback only for a bug, or with ``debug``."""
    try:
        with interrupt_on_signals():
            code = body()
        sys.stdout.flush()  # a closed pipe shows here, not at exit (where Python would print a traceback)
        leave_process_group()
        return code
    except TrainingInterrupted as stop:
        _say(f"gan_accel: {stop}")
        _exit_on_late_signals(stop.exit_code)  # the stop is complete: a launcher's SIGTERM only ends the exit
        # every rank stopped at the same step: none exits (and has the launcher end the others) too early
        with suppress(Exception):
            leave_process_group()
        return stop.exit_code
    except KeyboardInterrupt as interrupt:
        if debug:
            raise
        name = str(interrupt) if str(interrupt) in signal.Signals.__members__ else "SIGINT"  # named by the handler
        how = "Ctrl-C" if name == "SIGINT" else name
        _say(f"error: interrupted ({how}) {_progress(interrupt)}")
        return 128 + signal.Signals[name]
    except Exception as error:
        if isinstance(error, BrokenPipeError) and _stdout_closed():
            return SIGPIPE_EXIT
        if debug:
            raise
        line = describe(error)
        if line is not None:
            _say(f"error: {printable(line)}")
            return 2
        if any(collective_failure(error)) and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):  # a launcher's SIGTERM to the survivors waits for the line
                signal.signal(signum, signal.SIG_IGN)
        failure = describe_collective_failure(error)
        if failure is None:
            raise
        if failure[1]:
            print(f"gan_accel: error: {failure[0]}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_SILENT_PEER)  # a broken process group cannot be torn down: its exit would wait or abort


def _exit_on_late_signals(code: int) -> None:
    """After an agreed stop, a SIGINT/SIGTERM during the exit ends it with ``code`` (the launcher SIGTERMs every
    worker once one exits non-zero); from ``atexit`` on they are ignored (Python restores default handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def end(signum: int, frame: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, end)
    atexit.register(lambda: [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)])


def _stdout_closed() -> bool:
    """Whether stdout's reader has gone; if so stdout is pointed at /dev/null, so the flush at exit does not fail."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        closed = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (captured output), or no poll()
        return False
    if closed:
        with suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
    return closed


def _say(line: str) -> None:
    if is_first_process():
        print(line, file=sys.stderr, flush=True)
