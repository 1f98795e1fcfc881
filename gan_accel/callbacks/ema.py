"""Exponential moving average of the generator's weights (docs/evaluation.md, "The EMA of G").

The average lives outside Accelerate: a plain module on the same device, updated after every generator step
from the unwrapped G. Under DDP every rank holds identical G weights, so every rank holds an identical
average without communication, and a checkpoint keeps one copy of it.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch import nn

from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

BATCHNORM_MODES = ("copy", "recompute")


class EMA:
    """A moving average of a module's parameters.

    Args:
        model: the module to average (unwrapped).
        decay: per-update decay in (0, 1), at most ``(1 + n) / (10 + n)`` at update n; or ``half_life_images``.
        half_life_images: half-life of an update's weight, in training images; or a function of the images seen
            before the update (a :class:`~gan_accel.config.Ramp`).
        rampup: with ``half_life_images``: cap the half-life at ``rampup * images seen``.
        batchnorm: ``"copy"`` G's BatchNorm buffers, or ``"recompute"`` them for the averaged weights.
    """

    def __init__(self, model: nn.Module, decay: float | None = 0.999, *, half_life_images: float | None = None,
                 rampup: float | None = None, batchnorm: str = "copy") -> None:
        if (decay is None) == (half_life_images is None):
            raise ValueError("give the EMA either decay or half_life_images, not both or neither")
        if decay is not None and not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        if half_life_images is not None and not callable(half_life_images) and not half_life_images > 0:
            raise ValueError(f"EMA half_life_images must be > 0, got {half_life_images}")
        if rampup is not None and not rampup > 0:
            raise ValueError(f"EMA rampup must be > 0 or None, got {rampup}")
        if batchnorm not in BATCHNORM_MODES:
            raise ValueError(f"EMA batchnorm={batchnorm!r} is invalid: choose {' or '.join(BATCHNORM_MODES)}")
        self.decay, self.half_life_images, self.rampup = decay, half_life_images, rampup
        self.batchnorm = batchnorm
        self.num_updates = 0
        self.images_seen = 0
        self.stale = batchnorm == "recompute"  # the buffers do not yet match the averaged weights
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    def current_decay(self, images_per_update: int = 1) -> float:
        """The decay the next update uses (``images_per_update``: training images in one G step)."""
        if self.decay is not None:  # with a short-run warmup
            return min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        half_life = self.half_life_images
        if callable(half_life):
            half_life = half_life(self.images_seen)
        if self.rampup is not None:
            half_life = min(half_life, self.images_seen * self.rampup)
        if half_life <= 0:  # nothing seen yet: the average starts as a copy of G
            return 0.0
        return 0.5 ** (images_per_update / half_life)

    @torch.no_grad()
    def update(self, model: nn.Module, images_per_update: int = 1) -> None:
        """Move the average towards ``model`` (the unwrapped G) after a G step on that many images."""
        decay = self.current_decay(images_per_update)
        shadow = dict(self.module.named_parameters())
        for name, param in model.named_parameters():
            shadow[name].lerp_(param.detach().to(shadow[name].dtype), 1.0 - decay)
        if self.batchnorm == "copy":
            shadow_buffers = dict(self.module.named_buffers())
            for name, buffer in model.named_buffers():
                shadow_buffers[name].copy_(buffer)
        else:
            self.stale = True
        self.num_updates += 1
        self.images_seen += images_per_update

    @torch.no_grad()
    def recompute_batchnorm(self, batches: Iterable[Callable[[nn.Module], Any]]) -> None:
        """Measure the average's BatchNorm statistics anew as the plain mean over ``batches``, each running the
        module once (e.g. ``lambda G: G(z)``)."""
        norms = [m for m in self.module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                 and m.track_running_stats]
        if norms:
            momenta = [m.momentum for m in norms]
            for m in norms:
                m.reset_running_stats()
                m.momentum = None  # cumulative average over the batches below
            self.module.train()
            try:
                for run in batches:
                    run(self.module)
            finally:
                self.module.eval()
                for m, momentum in zip(norms, momenta):
                    m.momentum = momentum
        self.stale = False

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "num_updates": self.num_updates, "decay": self.decay,
                "images_seen": self.images_seen, "stale": self.stale}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.num_updates = int(state["num_updates"])
        self.decay = state["decay"] if state["decay"] is None else float(state["decay"])
        self.images_seen = int(state["images_seen"])
        self.stale = bool(state["stale"])


class GeneratorEMA(Callback):
    """Keeps an :class:`EMA` of G, updated after every step; samples, evaluation and the exported weights use it
    (``trainer.sampling_generator()``)."""

    shared_state = True  # identical on every process: a checkpoint keeps the main process's copy only
    recompute_batches = 8  # batches of 256 latents measure the average's BatchNorm statistics

    def __init__(self, decay: float | None = None, *, half_life_images: float | None = None,
                 rampup: float | None = None, batchnorm: str = "copy") -> None:
        self.options = dict(decay=decay, half_life_images=half_life_images, rampup=rampup, batchnorm=batchnorm)
        self.ema: EMA | None = None
        self._trainer: "GANTrainer | None" = None

    def setup(self, trainer: "GANTrainer") -> None:
        self._trainer = trainer
        self.ema = EMA(trainer.accelerator.unwrap_model(trainer.G), **self.options)

    def on_step_end(self, trainer: "GANTrainer") -> None:
        self.ema.update(trainer.accelerator.unwrap_model(trainer.G), trainer.images_per_step)

    @property
    def module(self) -> nn.Module:
        """The averaged G, ready to sample from (BatchNorm statistics recomputed if they are stale)."""
        self.refresh_batchnorm()
        return self.ema.module

    def refresh_batchnorm(self) -> None:
        """Recompute the average's BatchNorm statistics if its weights moved since the last time."""
        if self.ema.stale and self._trainer is not None:
            self.ema.recompute_batchnorm(self._batches(self._trainer))

    def _batches(self, trainer: "GANTrainer", size: int = 256) -> list[Callable[[nn.Module], Any]]:
        """Fixed latents (labels cycling over the classes), the same on every process, off the training RNG."""
        device = trainer.accelerator.device
        latents = [trainer.draw_latents(size, trainer.config.seed + 1 + i, device) for i in range(self.recompute_batches)]
        if not trainer.conditioning.conditional:
            return [lambda G, z=z: G(z) for z in latents]
        labels = (torch.arange(size) % trainer.config.num_classes).to(device)
        return [lambda G, z=z: G(z, labels) for z in latents]

    def state_dict(self) -> dict:
        self.refresh_batchnorm()  # a checkpoint's EMA has BatchNorm statistics that fit its weights
        return self.ema.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.ema.load_state_dict(state)
