"""No collective waits without bound, and Ctrl-C always works, on several processes.

With more than one process, every process runs a watchdog (:mod:`.service`) from the moment its
Accelerator exists until it leaves the process group:

- **Liveness.** Each process bumps a heartbeat counter in the rendezvous store every second or so,
  from a thread, and watches the others'. A process whose counter has not moved for
  ``TrainConfig.collective_timeout`` seconds (``--collective-timeout``, 120 by default) is stopped,
  dead, unreachable or hung: the first process to notice prints one line naming it, the others
  follow, and every process exits with code 75 (``EX_TEMPFAIL``: resume with ``--resume latest``).
  A busy process keeps beating, so the main process alone evaluating or writing a checkpoint while
  the others wait never trips it.
- **A bounded backstop.** torch's own collective timeout becomes ``max(600, 5 * collective_timeout)``
  seconds (gloo's default is 30 minutes): it ends a wait for a process that is alive but never
  arrives (a deadlock), which heartbeats cannot see.
- **Signals inside a wait.** Python runs signal handlers only in the main thread between bytecodes,
  so a Ctrl-C that arrives while the main thread is blocked in a collective waits for the collective.
  The watchdog hears it at once (``signal.set_wakeup_fd``): when a peer is silent too, the graceful
  stop cannot happen, and the process ends within seconds with one line; a second Ctrl-C (at least
  0.25 s after the first: launchers deliver one Ctrl-C twice within milliseconds) ends it within two
  seconds, wherever the main thread is.

Hooks in the rest of the package (one line each): ``engine.launch.build_accelerator`` and
``engine.build.prepare_run`` call :func:`start_watchdog` (the latter for an Accelerator the user
built); ``engine.run_open.open_run`` calls :func:`watch_run` (this run's step and checkpoints are
what a line reports); ``collective.leave_process_group`` calls :func:`stop_watchdog` after its
barrier; ``scripts.run_script`` asks :mod:`.run_record` what to say when interrupted;
``callbacks.signals`` takes :data:`~.liveness.DUPLICATE_SIGNAL_WINDOW` for duplicate deliveries.
"""

from __future__ import annotations

import atexit
import os
import threading
from datetime import timedelta
from typing import Any

from . import run_record
from .run_record import checkpoint_note, claim_ending, interrupted_line, track_run, where
from .service import EXIT_SILENT_PEER, Watchdog, backstop_seconds, watchdog_store

__all__ = ["EXIT_SILENT_PEER", "Watchdog", "active_watchdog", "backstop_seconds", "checkpoint_note",
           "claim_ending", "describe_collective_failure", "exit_on_late_signals", "first_to_end", "interrupted_line",
           "run_record", "start_watchdog", "stop_watchdog", "track_run", "watch_run", "where"]

_active: Watchdog | None = None
_group: Any = None
_lock = threading.Lock()
_hooks_installed = False


def start_watchdog(timeout: float) -> Watchdog | None:
    """Start this process's watchdog (a no-op with one process, without a process group, or when it runs).

    Call on every process once the default process group exists (``build_accelerator`` does).
    ``timeout``: seconds without a heartbeat after which a process is reported silent; calling again
    with another value changes it.
    """
    global _active, _group
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    with _lock:
        group = dist.distributed_c10d._get_default_group()
        if _active is not None and _group is group:
            _active.timeout = _active.judge.timeout = timeout
        else:
            if _active is not None:  # a process group of an earlier launch in this process
                _active.stop(goodbye=False)
            store = watchdog_store(dist.distributed_c10d._get_default_store(), timeout)
            _active = Watchdog(store, dist.get_rank(), dist.get_world_size(), timeout).start()
            _group = group
            _install_process_hooks()
        dist.set_timeout(timedelta(seconds=backstop_seconds(timeout)))
        return _active


def watch_run(trainer: Any) -> None:
    """``GANTrainer.__init__``: start the watchdog with the run's ``collective_timeout`` (for an Accelerator
    the user built; a no-op when ``build_accelerator`` started it) and report on this run when ending."""
    start_watchdog(trainer.config.collective_timeout)
    track_run(trainer)


def first_to_end(code: int, otherwise: bool = True) -> bool:
    """Tell the other processes this one ends the run (they follow, quietly, with ``code``); True when
    this process is the first to, so it prints why. Without a watchdog: ``otherwise``."""
    watchdog = _active
    return otherwise if watchdog is None else watchdog.announce(code)


def exit_on_late_signals(code: int) -> None:
    """After a clean, agreed stop: a SIGINT/SIGTERM that arrives while the process exits ends it at once
    with ``code``, instead of raising ``KeyboardInterrupt`` in the middle of the exit or killing it.

    A launcher sends such signals: ``torchrun`` / ``accelerate launch`` SIGTERMs every worker still
    running as soon as one exits with a non-zero code (130 after a Ctrl-C), so the slower ranks of a
    clean stop were killed (exit -15) or, still inside ``fit``, took it for an insisting Ctrl-C. Python
    puts its own handlers back to the default action when the interpreter finalizes, but leaves an
    ignored signal ignored: from ``atexit`` on, these signals are ignored (the process is ending anyway).
    """
    import signal
    import sys

    def end(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    def ignore() -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, end)
        atexit.register(ignore)


def stop_watchdog(goodbye: bool = True) -> None:
    """Stop this process's watchdog (``leave_process_group`` does, after its barrier). ``goodbye``: tell the
    others this process leaves on purpose, so that it is never reported silent."""
    global _active, _group
    with _lock:
        watchdog, _active, _group = _active, None, None
    if watchdog is not None:
        watchdog.stop(goodbye=goodbye)


def active_watchdog() -> Watchdog | None:
    return _active


def _install_process_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop_watchdog)  # a clean interpreter exit says goodbye
    # A forked child (a DataLoader worker) must not write its signals into this process's pipe.
    os.register_at_fork(after_in_child=_forget_in_child)


def _forget_in_child() -> None:
    global _active, _group
    _active, _group = None, None  # its threads did not survive the fork
    try:
        import signal

        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):  # forked from a thread other than the main one
        pass


def describe_collective_failure(error: BaseException) -> str | None:
    """One line for a collective that failed because another process went away or a wait hit the
    backstop timeout (gloo's and the store's own errors), else None."""
    text = str(error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    gone = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    if any(marker in text for marker in gone):
        why = "another process ended or lost its connection"
    elif "Timed out waiting" in text or "wait timeout" in text:
        why = "a wait for another process ran past torch's timeout (alive but never arriving: a deadlock or a hang)"
    else:
        return None
    if "] " in first:  # drop gloo's "[/path/to/pair.cc:545] " prefix
        first = first.split("] ", 1)[1]
    return f"{why} ({first[:160]}), {where()}; {checkpoint_note()}"
