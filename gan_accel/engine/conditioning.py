"""Class-conditional runs (``config.num_classes`` set): which labels G is given, and the progress grids' labels.

The real labels travel in the batch with their images, so they stay paired through sharding, accumulation
and resume. G's labels: uniform by default, the real micro-batch's own with ``label_distribution="data"``,
or a ``label_sampler`` you pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import torch

from ..config import TrainConfig
from ..errors import PreflightError
from .latents import LabelSampler, LatentSampler, draw_fixed_latents, leading_size, uniform_labels


@dataclass(frozen=True)
class Conditioning:
    """How a run conditions G and D (``num_classes=None``: unconditional)."""

    num_classes: int | None = None
    sampler: LabelSampler | None = None  # None in a conditional run: G gets the real micro-batch's labels

    @property
    def conditional(self) -> bool:
        return self.num_classes is not None

    def fake_labels(self, batch_size: int, device: torch.device, real_labels: torch.Tensor | None) -> torch.Tensor | None:
        """The labels G is asked for in a micro-batch (None in an unconditional run)."""
        if not self.conditional:
            return None
        if self.sampler is None:
            return real_labels
        return self.sampler(batch_size, device)

    def per_class(self, num_samples: int) -> int:
        """Columns of a progress grid: ``num_samples // num_classes`` samples per class (at least 1)."""
        return max(1, num_samples // self.num_classes) if self.conditional else num_samples

    def fixed_labels(self, num_samples: int) -> torch.Tensor | None:
        """One row per class (``per_class`` of class 0, then of class 1, ...): the same on every process."""
        return torch.arange(self.num_classes).repeat_interleave(self.per_class(num_samples)) if self.conditional \
            else None

    def draw_fixed(self, sampler: LatentSampler, config: TrainConfig) -> tuple[Any, torch.Tensor | None]:
        """The progress samples' latents (from ``config.seed``) and labels (one grid row per class)."""
        count = self.per_class(config.num_samples) * (self.num_classes or 1)  # a whole row per class
        latents = draw_fixed_latents(sampler, count, config.seed)
        if leading_size(latents) != count:
            raise PreflightError(f"the latent sampler returned {leading_size(latents)} fixed latents when asked "
                                 f"for {count}")
        return latents, self.fixed_labels(config.num_samples)


def conditioning_for(config: TrainConfig, label_sampler: LabelSampler | None) -> Conditioning:
    if config.num_classes is None:
        if label_sampler is not None:
            raise ValueError("label_sampler is given but config.num_classes is None: set num_classes for a "
                             "conditional run, or leave the label sampler out")
        return Conditioning()
    if label_sampler is None and config.label_distribution == "uniform":
        label_sampler = uniform_labels(config.num_classes)
    return Conditioning(config.num_classes, label_sampler)
