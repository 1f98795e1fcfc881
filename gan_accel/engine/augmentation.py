"""A run's augmentation of the images D sees, and ADA's adaptive probability as a run state.

Every call of D through ``ctx.discriminate`` or ``ctx.class_logits`` augments its input first, whoever the
phase (R1 and the gradient penalty take their input gradient through the differentiable augmentation);
sampling, the EMA and evaluation never call D. With ``augment="ada"``, p is steered by
:class:`~gan_accel.augment.AdaptiveP` from D's logits on reals (``ctx.observe_real``), the same on every
process; p and the partial interval are part of the checkpoint.
"""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator
from torch import Tensor

from ..augment import AdaptiveP, Augment, build_augment
from ..config import Ramp, TrainConfig
from .schedules import first_value


class RunAugmentation:
    """The augmentation ``config.augment`` asks for (``augment`` is None for "none") and, for ADA, its p."""

    def __init__(self, config: TrainConfig, accelerator: Accelerator) -> None:
        self.augment: Augment | None = None
        self.controller: AdaptiveP | None = None
        self.interval = config.ada_interval
        self.ramp = config.augment_p if isinstance(config.augment_p, Ramp) else None  # diffaugment's p (ada refuses)
        if config.augment == "none":
            return
        options = {} if config.augment_p is None else {"p": first_value(config.augment_p)}
        self.augment = build_augment(config.augment, **options)
        if config.augment == "ada" and config.ada_signal == "rt":  # "heldout": the OverfitSteering callback moves p
            # ticks count steps (the controller updates every `interval` of them, on every process alike)
            self.controller = AdaptiveP(self.augment, target=config.ada_target, interval=config.ada_interval,
                                        ada_kimg=config.ada_kimg, p=config.augment_p or 0.0,
                                        reduce=lambda t: accelerator.reduce(t, "sum"), device=accelerator.device)

    def observe_real(self, logits: Tensor) -> None:
        """D's logits on real images (from D's adversarial loss): ADA's statistic."""
        if self.controller is not None:
            self.controller.observe(logits)

    def start_step(self, images: int) -> None:
        """Every step, before its phases: a Ramp of ``augment_p`` at the training images seen before it."""
        if self.ramp is not None:
            self.augment.p = self.ramp(images)

    def end_step(self) -> None:
        """Every step on every process: ADA updates p every ``ada_interval`` steps (a collective)."""
        if self.controller is not None:
            self.controller.tick()

    def metrics(self) -> dict[str, float]:
        """``augment/p`` (and ``augment/rt``, the last interval's statistic) for the metrics row."""
        if self.augment is None:
            return {}
        row = {"augment/p": float(self.augment.p)}
        if self.controller is not None and self.controller.rt is not None:
            row["augment/rt"] = float(self.controller.rt)
        return row

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.controller is None else self.controller.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.controller is not None and state is not None:
            self.controller.load_state_dict(state)


def augmented(augment: Augment | None, x: Tensor) -> Tensor:
    """``augment(x)``, or ``x`` itself without an augmentation."""
    return x if augment is None else augment(x)
