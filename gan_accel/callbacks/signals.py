"""Graceful stop on SIGINT / SIGTERM: finish the current step, checkpoint, exit non-zero.

The handler only sets a flag; at the end of each step the processes agree on it (one one-element
all-reduce when there are several), so every rank asks the trainer to stop at the same step. The
trainer then fires ``on_checkpoint`` and raises :class:`~gan_accel.errors.TrainingInterrupted`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


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


class SignalHandler(Callback):
    """Turns SIGINT / SIGTERM into a checkpoint and a clean stop at the end of the current step."""

    name = "signals"

    def __init__(self) -> None:
        self.flag = StopFlag()
        self._handlers: contextlib.ExitStack | None = None

    def on_fit_start(self, trainer: "GANTrainer") -> None:
        self.flag = StopFlag()
        self._handlers = contextlib.ExitStack()
        self._handlers.enter_context(stop_on_signals(self.flag))

    def on_step_end(self, trainer: "GANTrainer") -> None:
        acc = trainer.accelerator
        if acc.num_processes == 1:
            stop = bool(self.flag)
        else:  # every rank must stop at the same step: agree on the flag
            local = torch.tensor([1.0 if self.flag else 0.0], device=acc.device)
            stop = acc.reduce(local, reduction="sum").item() > 0
        if stop:
            trainer.request_stop(self.flag.signum or signal.SIGTERM)  # another rank got the signal

    def on_close(self, trainer: "GANTrainer") -> None:
        if self._handlers is not None:
            self._handlers.close()
            self._handlers = None
