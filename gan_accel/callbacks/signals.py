"""Graceful stop on SIGINT / SIGTERM: finish the current step, checkpoint, exit non-zero.

The handler only sets a flag. One process stops at the end of the step the signal arrived in. Several
processes must stop at the same step, so they agree on the flag with a one-element all-reduce; it is
started without waiting at the end of step k (``async_op=True``) and read at the end of step k+1, when
it finished long ago: every rank then stops at the end of step k+1, one step after the first signal,
and no step waits for the agreement (a blocking all-reduce plus ``.item()`` every step, as before,
made every rank wait for the slowest one and, on a GPU, drained the device's queue every step).
Agreeing every few steps instead would also avoid the wait but stop up to that many steps late.
On CUDA the agreed value is copied to pinned host memory behind an event, so reading it a step
later waits for nothing queued after it. The trainer then fires ``on_checkpoint`` and raises
:class:`~gan_accel.errors.TrainingInterrupted`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ..watchdog.liveness import DUPLICATE_SIGNAL_WINDOW
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class StopFlag:
    """Set by the signal handler; read by the loop at step boundaries."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0  # time.monotonic() of the signal

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
        if flag:  # second signal: the user insists (unless it is the first one delivered twice)
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


class StopAgreement:
    """Agrees on a local stop flag across processes one step late, without a blocking sync.

    ``exchange(local)`` (every rank, once per step) returns whether any rank had the flag set at the
    previous call, and starts the all-reduce of ``local`` for the next call.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: tuple[Any, torch.Tensor, Any] | None = None  # (work to wait, value to read, event)

    def exchange(self, local: bool) -> bool:
        agreed = self._collect()
        flag = torch.full((1,), 1.0 if local else 0.0, device=self.device)  # a fill on the device, no copy
        work = torch.distributed.all_reduce(flag, async_op=True)
        if self.device.type == "cuda":
            work.wait()  # NCCL: the current stream waits for the collective, the host does not
            host = torch.empty(1, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (None, host, event)
        else:  # gloo runs it in the background: wait for it at the next step
            self._pending = (work, flag, None)
        return agreed

    def _collect(self) -> bool:
        if self._pending is None:
            return False
        work, value, event = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        if event is not None:
            event.synchronize()  # recorded a step ago: waits for nothing queued since
        return bool(value.item() > 0)


class SignalHandler(Callback):
    """Turns SIGINT / SIGTERM into a checkpoint and a clean stop at the end of the current step (with
    several processes, of the next step: see the module's docstring)."""

    def __init__(self) -> None:
        self.flag = StopFlag()
        self._handlers: contextlib.ExitStack | None = None
        self._agreement: StopAgreement | None = None

    def on_fit_start(self, trainer: "GANTrainer") -> None:
        self.flag = StopFlag()
        self._handlers = contextlib.ExitStack()
        self._handlers.enter_context(stop_on_signals(self.flag))
        acc = trainer.accelerator
        self._agreement = StopAgreement(acc.device) if acc.num_processes > 1 else None

    def on_step_end(self, trainer: "GANTrainer") -> None:
        if self._agreement is None:
            stop = bool(self.flag)
        else:  # every rank must stop at the same step: the flags as of the previous step, agreed
            stop = self._agreement.exchange(bool(self.flag))
        if stop:
            trainer.control.stop(self.flag.signum or signal.SIGTERM)  # or another rank got the signal

    def on_close(self, trainer: "GANTrainer") -> None:
        self._agreement = None  # an agreement still running completes on its own (every rank started it)
        if self._handlers is not None:
            self._handlers.close()
            self._handlers = None
