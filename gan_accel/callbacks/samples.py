"""Progress samples from the fixed latents, in the form that suits the data.

* image batches (N, C, H, W): ``samples_<step>.png`` grids, and at the end ``samples_final.png`` and
  ``progress.gif`` (all grids as an animation);
* 2-D points (N, 2): ``samples_<step>.png`` scatter plots over real points, the same final files;
* anything else: ``samples_<step>.pt`` (``torch.save`` of the samples).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..pictures.samples import is_image_batch, is_point_batch, save_gif, save_grid, save_scatter
from ..state.layout import PROGRESS_GIF, progress_frames, samples_stem
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

KINDS = ("auto", "grid", "scatter", "tensor")


class SampleSaver(Callback):
    """Writes samples of the sampling generator (the EMA when enabled) on ``on_sample`` and at the end.

    ``kind``: ``"auto"`` chooses by the samples' shape; ``"grid"``, ``"scatter"`` or ``"tensor"`` force one.
    """

    def __init__(self, kind: str = "auto") -> None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
        self.kind = kind

    def on_sample(self, trainer: "GANTrainer") -> None:
        if trainer.accelerator.is_main_process:
            self.write(trainer, samples_stem(trainer.step))

    def on_fit_end(self, trainer: "GANTrainer") -> None:
        if not trainer.accelerator.is_main_process:
            return
        final = self.write(trainer, samples_stem(None))
        frames = progress_frames(trainer.output_dir)
        if final.suffix == ".png" and frames:
            trainer.control.record_file(save_gif(frames, trainer.output_dir / PROGRESS_GIF))

    def write(self, trainer: "GANTrainer", stem: str) -> Path:
        """Samples of the fixed latents as ``<stem>.png`` (grid or scatter) or ``<stem>.pt``, recorded as the run's."""
        path = self._write(trainer, stem)
        trainer.control.record_file(path)
        return path

    def _write(self, trainer: "GANTrainer", stem: str) -> Path:
        samples = trainer.generate()
        kind = self.kind if self.kind != "auto" else self.kind_for(samples)
        if kind == "grid":  # a conditional run: one row per class
            columns = trainer.conditioning.per_class(trainer.config.num_samples) if trainer.fixed_labels is not None \
                else None
            return save_grid(samples, trainer.output_dir / f"{stem}.png", nrow=columns)
        if kind == "scatter":
            return save_scatter(samples, trainer.output_dir / f"{stem}.png", reference=trainer.reference_samples,
                                title=f"step {trainer.step}")
        path = trainer.output_dir / f"{stem}.pt"
        torch.save(samples.cpu(), path)
        return path

    @staticmethod
    def kind_for(samples: torch.Tensor) -> str:
        if is_image_batch(samples):
            return "grid"
        if is_point_batch(samples):
            return "scatter"
        return "tensor"
