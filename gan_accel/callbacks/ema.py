"""Exponential moving average of the generator's weights (a cheap, reliable sample-quality boost).

The average lives outside Accelerate: it is a plain module on the same device, updated after every
generator step from the unwrapped G. Under DDP every rank holds identical G weights, so every rank
holds an identical average without any communication.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class EMA:
    """``shadow = decay * shadow + (1 - decay) * G`` after each G step; buffers are copied as they are.

    ``warmup``: the effective decay is ``min(decay, (1 + step) / (10 + step))`` so that the
    average does not drag the random initialisation along in short runs.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999, warmup: bool = True) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.warmup = warmup
        self.num_updates = 0
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    def current_decay(self) -> float:
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model`` (the unwrapped G)."""
        decay = self.current_decay()
        shadow = dict(self.module.named_parameters())
        for name, param in model.named_parameters():
            shadow[name].lerp_(param.detach().to(shadow[name].dtype), 1.0 - decay)
        shadow_buffers = dict(self.module.named_buffers())
        for name, buffer in model.named_buffers():
            shadow_buffers[name].copy_(buffer)
        self.num_updates += 1

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "num_updates": self.num_updates, "decay": self.decay}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.num_updates = int(state["num_updates"])
        self.decay = float(state["decay"])


class EMACallback(Callback):
    """Keeps an :class:`EMA` of G, updated after every step; samples and the exported weights use it."""

    name = "ema"

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.ema: EMA | None = None

    def setup(self, trainer: "GANTrainer") -> None:
        self.ema = EMA(trainer.accelerator.unwrap_model(trainer.G), self.decay)

    def on_step_end(self, trainer: "GANTrainer") -> None:
        self.ema.update(trainer.accelerator.unwrap_model(trainer.G))

    @property
    def module(self) -> nn.Module:
        return self.ema.module

    def state_dict(self) -> dict:
        return self.ema.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state)
