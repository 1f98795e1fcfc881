"""ADA's augmentation probability steered by D's measured overfitting instead of by ADA's r_t.

ADA's r_t (the sign of D on its training reals) reads high as soon as D tells reals from G's samples, which
on a small set is from the first steps, so p rises early and slows G while D still generalises. The held-out
view measures what augmentation is for: D judging real images it never trained on like G's samples. Every
``interval`` steps this callback takes D's probe (callbacks/d_probe.py: training reals, held-out reals, G's
fixed samples, the run left untouched) and moves p by ``sign(overfit - target) * images / (ada_kimg * 1000)``,
clamped to [0, p_max], as ADA moves it; p stays at 0 while D generalises and rises once it memorises.

The run's config asks for it with ``augment="ada", ada_signal="heldout"`` (the engine then leaves p alone);
``gan-accel train`` adds it with the images it holds out. Every process takes the same probe and the overfit
value is averaged over processes, so p is the same everywhere; p is part of the checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError
from .base import Callback
from .d_probe import probe_logits, probe_statistics
from .health import PROBE_REALS

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class OverfitSteering(Callback):
    """Moves the run's ADA p towards D's held-out ``overfit`` ratio ``target`` (``config.ada_target``)
    every ``interval`` steps (``config.ada_interval``, at least ``min_interval``); logs ``augment/overfit``.

    ``held_out``: real images never trained on, shaped like the training samples (with their labels as a
    ``(images, labels)`` pair for a conditional run)."""

    def __init__(self, held_out: torch.Tensor | tuple[torch.Tensor, torch.Tensor], *, min_interval: int = 25,
                 p_max: float = 0.99) -> None:
        images, labels = held_out if isinstance(held_out, tuple) else (held_out, None)
        if not isinstance(images, torch.Tensor) or images.dim() < 2 or len(images) < 2:
            raise ConfigError("OverfitSteering needs at least 2 held-out real images (a tensor shaped like a batch)")
        self.held_out, self.held_labels = images, labels
        self.min_interval, self.p_max = min_interval, p_max
        self.p = 0.0
        self.overfit: float | None = None  # the last measurement (averaged over processes)
        self.reals: torch.Tensor | None = None
        self.real_labels: torch.Tensor | None = None
        self.augment: Any = None

    def setup(self, trainer: "GANTrainer") -> None:
        cfg, augmentation = trainer.config, trainer.runner.augmentation
        if cfg.augment != "ada" or getattr(cfg, "ada_signal", "rt") != "heldout":
            raise ConfigError("OverfitSteering steers ADA's p from the held-out view: set augment='ada' and "
                              "ada_signal='heldout' in the TrainConfig (or leave the callback out)")
        self.augment = augmentation.augment
        self.p = float(self.augment.p)
        reference = trainer.reference_samples
        self.reals = reference[:PROBE_REALS].clone()
        labels = getattr(trainer, "reference_labels", None)
        self.real_labels = None if labels is None else labels[:PROBE_REALS].clone()
        self.interval = max(self.min_interval, cfg.ada_interval)

    def on_step_end(self, trainer: "GANTrainer") -> None:
        if trainer.step % self.interval:
            return
        logits = probe_logits(trainer, self.reals, self.real_labels, self.held_out, self.held_labels)
        # No ratio while D barely separates reals from G's samples (OVERFIT_MIN_GAP): nothing to overfit, p falls.
        overfit = probe_statistics(logits["real"], logits["fake"], logits["held_out"]).get("health/overfit", 0.0)
        acc = trainer.accelerator
        value = float(acc.reduce(torch.tensor([overfit], dtype=torch.float64, device=acc.device), "mean").item())
        self.overfit = value
        cfg = trainer.config
        step = self.interval * trainer.images_per_step / (cfg.ada_kimg * 1000)
        direction = (value > cfg.ada_target) - (value < cfg.ada_target)
        self.p = min(max(self.p + direction * step, 0.0), self.p_max)
        self.augment.p = self.p
        trainer.control.log({"augment/overfit": value})

    def state_dict(self) -> dict[str, Any]:
        return {"p": self.p, "overfit": self.overfit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.p, self.overfit = float(state["p"]), state.get("overfit")
        if self.augment is not None:
            self.augment.p = self.p
