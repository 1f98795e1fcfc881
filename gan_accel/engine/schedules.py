"""Learning-rate schedules counted in optimizer steps, whatever the number of processes, and the config's
:class:`~gan_accel.config.Ramp` s counted in training images.

Accelerate steps a prepared scheduler ``num_processes`` times per optimizer step, so a warmup would end
twice as early on two processes: the ``LambdaLR`` counts *ticks* and divides them by Accelerate's ticks
per optimizer step.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Mapping

import torch
from accelerate import Accelerator
from torch.optim.lr_scheduler import LambdaLR

from ..config import Ramp, TrainConfig

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


def first_value(value: Any) -> Any:
    """A number as it is, a Ramp's start: what an optimizer is built with (:class:`StepRamps` moves it)."""
    return value.start if isinstance(value, Ramp) else value


class StepRamps:
    """Sets the config's learning-rate and betas Ramps in the optimizers gan_accel built, at the start of each step,
    from the training images seen before it: ``step x images_per_step`` (batch x accumulation x processes).

    A learning-rate Ramp is the scheduler's base rate, so the warmup/decay multiplier still applies on top and
    the rate is computed as ``LambdaLR`` computes it. Values are functions of the step alone: a resumed run
    sets the same ones, and nothing is added to the checkpoint.
    """

    def __init__(self, config: TrainConfig, num_processes: int, optimizers: Mapping[str, Any],
                 schedulers: Mapping[str, Any], built: Iterable[str]) -> None:
        self.images_per_step = config.batch_size * config.grad_accum_steps * num_processes
        self.setters: list[Callable[[int], None]] = []
        for name in built:
            lr, betas = (config.lr_D, config.betas_D) if name == "D" else (config.lr_G, config.betas_G)
            opt = optimizers[name]  # read its param_groups when setting: loading a checkpoint replaces the list
            if isinstance(lr, Ramp):
                self.setters.append(lambda n, lr=lr, s=getattr(schedulers[name], "scheduler", schedulers[name]),
                                    opt=opt: set_base_lr(lr(n), s, opt.param_groups))
            if any(isinstance(beta, Ramp) for beta in betas):
                self.setters.append(lambda n, betas=betas, opt=opt: set_betas(betas, n, opt.param_groups))

    def apply(self, step: int) -> int:
        """Set this step's values; returns the training images seen before it (what every Ramp reads)."""
        images = step * self.images_per_step
        for setter in self.setters:
            setter(images)
        return images


def set_base_lr(base: float, scheduler: LambdaLR, groups: list[dict[str, Any]]) -> None:
    """Make ``base`` the scheduler's base rate, and each group's rate what ``LambdaLR`` computes from it now."""
    for index, group in enumerate(groups):
        scheduler.base_lrs[index] = base
        group["lr"] = base * scheduler.lr_lambdas[index](scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]


def set_betas(betas: tuple[Any, ...], images: int, groups: list[dict[str, Any]]) -> None:
    """Set the betas (a Ramp's value after ``images`` training images) in every group."""
    values = tuple(beta(images) if isinstance(beta, Ramp) else beta for beta in betas)
    for group in groups:
        group["betas"] = values
