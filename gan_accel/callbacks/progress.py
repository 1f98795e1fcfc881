"""Progress: a tqdm bar over steps with the latest losses, and how long the run will take (local main process).

The estimate is measured, not guessed: the first steps (allocations, caches) are left out, then the steps of
about ten seconds are timed and the rest of the run projected from them, once, in one line.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from ..text import describe_duration, time_limit_clause
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

WARMUP_STEPS = 5  # not timed: the first steps allocate memory and fill caches
MEASURE_SECONDS = 10.0  # the estimate comes once this much time (or MEASURE_STEPS steps) has been timed
MEASURE_STEPS = 200


class ProgressBar(Callback):
    """Steps done of ``max_steps`` (a bar with ``keys`` of the last logged row, when ``config.progress_bar``), and
    one line projecting the run's training time from its measured speed."""

    def __init__(self, keys: tuple[str, ...] = ("loss/D", "loss/G", "D(x)", "D(G(z))", "images/s")) -> None:
        self.keys = keys
        self.bar: Any = None
        self._timing: tuple[int, float] | None = None  # (step, time) where the timed steps start
        self._estimated = True

    def on_fit_start(self, trainer: "GANTrainer") -> None:
        shown = trainer.accelerator.is_local_main_process
        self.bar = tqdm(total=trainer.config.max_steps, initial=trainer.step, desc="train", dynamic_ncols=True,
                        disable=not (shown and trainer.config.progress_bar))
        self._timing, self._estimated, self._started = None, not shown, time.perf_counter()
        self._first = trainer.step + min(WARMUP_STEPS, (trainer.config.max_steps - trainer.step) // 10)

    def on_step_end(self, trainer: "GANTrainer") -> None:
        self.bar.update(1)
        if self._estimated:
            return
        if self._timing is None:
            if trainer.step >= self._first:
                self._timing = (trainer.step, time.perf_counter())
            return
        start_step, start = self._timing
        steps, elapsed = trainer.step - start_step, time.perf_counter() - start
        if elapsed >= MEASURE_SECONDS or steps >= MEASURE_STEPS:
            self._estimated = True
            time_left = None if trainer.config.max_time is None else \
                trainer.config.max_time - (time.perf_counter() - self._started)
            trainer.accelerator.print(f"gan_accel: {estimate(trainer, steps / elapsed, time_left)}")

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        self.bar.set_postfix({k: f"{row[k]:.3g}" for k in self.keys if k in row})

    def on_close(self, trainer: "GANTrainer") -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def estimate(trainer: "GANTrainer", steps_per_second: float, time_left: float | None = None) -> str:
    """``5,000 steps ≈ 14 min at 380 images/s on 1 process``, with what is left and, when the time limit leaves
    ``time_left`` seconds, the step where it ends the run."""
    cfg, processes = trainer.config, trainer.accelerator.num_processes
    left = cfg.max_steps - trainer.step
    line = (f"{cfg.max_steps:,} steps ≈ {describe_duration(cfg.max_steps / steps_per_second)} at "
            f"{steps_per_second * trainer.images_per_step:,.0f} images/s on {processes} process"
            f"{'es' if processes > 1 else ''} (training steps alone, measured over the last ones); {left:,} to go, "
            f"about {describe_duration(left / steps_per_second)}")
    if time_left is not None and left / steps_per_second > time_left:
        line += time_limit_clause(cfg.max_time, trainer.step + int(max(time_left, 0) * steps_per_second),
                                  cfg.warmup_ratio * cfg.max_steps)
    return line
