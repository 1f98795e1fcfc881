"""Graceful stop on SIGINT / SIGTERM: finish the current step, checkpoint, exit non-zero."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


class TrainingInterrupted(RuntimeError):
    """Raised by ``fit`` after a signal-triggered final checkpoint. ``exit_code`` is 128 + the signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopFlag:
    """Set by the signal handler; read by the loop at step boundaries."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __bool__(self) -> bool:
        return self.signum is not None


@contextmanager
def stop_on_signals(flag: StopFlag, signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[StopFlag]:
    """Install handlers that only set ``flag`` (a second signal still interrupts at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield flag  # handlers can only be installed from the main thread
        return
    previous = {s: signal.getsignal(s) for s in signums}

    def handler(signum, frame):
        if flag:  # second signal: the user insists
            signal.signal(signum, previous[signum])
            raise KeyboardInterrupt
        flag.signum = signum

    for s in signums:
        signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
