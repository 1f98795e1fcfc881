"""What users and callbacks read of a trainer: its networks by their usual names, its counters, and
samples of its generator. Nothing here changes the run (see ``GANTrainer._apply`` for what does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .latents import draw_fixed_latents, generate_samples, map_tensors


def _entry(table: str, name: str) -> property:
    return property(lambda self: getattr(self, table)[name], doc=f"``self.{table}[{name!r}]``")


class TrainerViews:
    """Read-only views of a :class:`~gan_accel.GANTrainer` (its base class)."""

    # The prepared networks, optimizers and schedulers by their usual names (all are in the dicts).
    G = _entry("networks", "G")
    D = _entry("networks", "D")
    opt_G = _entry("optimizers", "G")
    opt_D = _entry("optimizers", "D")
    sched_G = _entry("schedulers", "G")
    sched_D = _entry("schedulers", "D")

    @property
    def step(self) -> int:
        """Steps completed: passes over the phase list (``state.step``)."""
        return self.state.step

    @property
    def last_checkpoint(self) -> Path | None:
        """The newest complete checkpoint of this run (``state.last_checkpoint``)."""
        return self.state.last_checkpoint

    @property
    def last_checkpoint_step(self) -> int | None:
        """The step of :attr:`last_checkpoint` (``state.last_checkpoint_step``)."""
        return self.state.last_checkpoint_step

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint this run was resumed from (``state.resumed_from``)."""
        return self.state.resumed_from

    @property
    def run_id(self) -> str | None:
        """The run's id, named in its checkpoints (``state.run_id``; None on processes other than the main one)."""
        return self.state.run_id

    @property
    def epoch(self) -> int:
        """Passes over the training data completed (zero-based index of the current one)."""
        return self.data.epoch

    @property
    def d_step(self) -> int:
        """Discriminator updates of the phase named "D" so far."""
        return self.runner.phase_runs.get("D", 0)

    @property
    def images_seen(self) -> int:
        """Real samples drawn on this process."""
        return self.runner.images_seen

    @property
    def ema(self) -> Any:
        """The EMA of G (None without the ``generator_ema`` callback)."""
        callback = self.callbacks.get("generator_ema")
        return callback.ema if callback is not None else None

    @property
    def images_per_step(self) -> int:
        """Latents G trains on in one step, over all processes (batch x accumulation x processes)."""
        return self.config.batch_size * self.config.grad_accum_steps * self.accelerator.num_processes

    def sampling_generator(self) -> nn.Module:
        """The generator to sample from: the EMA when enabled, else the unwrapped G."""
        callback = self.callbacks.get("generator_ema")
        return callback.module if callback is not None else self.accelerator.unwrap_model(self.G)

    def draw_latents(self, count: int, seed: int, device: torch.device | None = None) -> Any:
        """``count`` latents of the run's sampler from ``seed`` (on CPU, or moved to ``device``): the same
        on every process, and the training noise is not shifted (for evaluation and the EMA's statistics)."""
        latents = draw_fixed_latents(self.sample_latents, count, seed)
        return latents if device is None else map_tensors(latents, lambda t: t.to(device))

    def generate(self, latents: Any = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Samples from :meth:`sampling_generator` in eval mode: the fixed latents (and fixed labels)
        by default; a conditional run needs ``labels`` (class indices) with its own ``latents``."""
        if latents is None:
            latents, labels = self.fixed_latents, self.fixed_labels if labels is None else labels
        if self.conditioning.conditional and labels is None:
            raise ValueError("a conditional run samples G(z, y): pass labels (class indices) with the latents")
        return generate_samples(self.sampling_generator(), latents, self.accelerator,
                                labels if self.conditioning.conditional else None)

    def checkpoint_note(self) -> str:
        """Where the run can be resumed from, for error messages."""
        if self.state.last_checkpoint is None:
            return ("No checkpoint of this run was written, so there is nothing to resume: start it again in "
                    "another output folder (gan-accel never deletes a run).")
        return (f"The last complete checkpoint is {self.state.last_checkpoint}; resume with --resume latest "
                "(fit(resume_from='latest')) and the same output folder.")
