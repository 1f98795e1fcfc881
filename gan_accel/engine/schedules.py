"""Learning-rate schedules counted in optimizer steps, whatever the number of processes.

Accelerate steps a prepared scheduler ``num_processes`` times per optimizer step, so a warmup would end
twice as early on two processes: the ``LambdaLR`` counts *ticks* and divides them by Accelerate's ticks
per optimizer step.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from accelerate import Accelerator
from torch.optim.lr_scheduler import LambdaLR

LRMultiplier = Callable[[int], float]


def warmup_then_decay(total_steps: int, warmup_steps: int, schedule: str = "linear") -> LRMultiplier:
    """Multiplier of the base learning rate after ``step`` optimizer steps: linear warmup from 0 over
    ``warmup_steps``, then linear decay to 0 at ``total_steps`` (``"linear"``) or 1 (``"constant"``)."""
    if total_steps < 1 or not 0 <= warmup_steps < total_steps + 1:
        raise ValueError(f"need total_steps >= 1 and 0 <= warmup_steps <= total_steps, got {total_steps}, {warmup_steps}")
    if schedule not in ("linear", "constant"):
        raise ValueError(f"schedule={schedule!r}: choose 'linear' or 'constant'")

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        if schedule == "constant":
            return 1.0
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return multiplier


def scheduler_ticks_per_optimizer_step(accelerator: Accelerator) -> int:
    """How many times Accelerate calls ``scheduler.step()`` for one optimizer step (see module doc)."""
    if not accelerator.step_scheduler_with_optimizer or accelerator.split_batches:
        return 1
    return accelerator.num_processes


def lambda_scheduler(optimizer: torch.optim.Optimizer, multiplier: LRMultiplier, ticks_per_step: int) -> LambdaLR:
    """A ``LambdaLR`` that applies ``multiplier`` to optimizer steps, given Accelerate's ticks per step (they
    come in a row, so integer division recovers the optimizer step exactly)."""
    if ticks_per_step < 1:
        raise ValueError(f"ticks_per_step must be >= 1, got {ticks_per_step}")
    return LambdaLR(optimizer, lambda tick: multiplier(tick // ticks_per_step))


def scheduler_stepper(accelerator: Accelerator, scheduler: Any) -> Callable[[], Any]:
    """What the runner calls to tick a prepared scheduler once per optimizer update, kept or skipped.

    Accelerate's wrapper holds the schedule back after a skipped step, but sees that only for some
    optimizers under fp16 (not a fused Adam's). The engine's rule is one: a skipped update uses up its step,
    so the rate at update ``n`` is the schedule's at ``n``; the inner scheduler is ticked here directly.
    """
    inner = getattr(scheduler, "scheduler", None)
    if inner is None:
        return scheduler.step
    ticks = 1 if not getattr(scheduler, "step_with_optimizer", True) or getattr(scheduler, "split_batches", False) \
        else accelerator.num_processes
    if ticks == 1 and not hasattr(inner, "total_steps") and accelerator.scaler is None:
        return inner.step

    def tick() -> None:
        for _ in range(ticks):
            if hasattr(inner, "total_steps") and inner._step_count > inner.total_steps:
                continue
            if inner._step_count == 1:  # torch warns "lr_scheduler.step() before optimizer.step()" when the
                with warnings.catch_warnings():  # first update was an fp16 skip: the engine's rule, not a bug
                    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
                    inner.step()
            else:
                inner.step()

    return tick
