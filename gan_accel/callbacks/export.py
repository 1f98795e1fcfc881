"""The finished run's generator as ``generator.safetensors`` (the EMA's weights when enabled)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..state.layout import GENERATOR
from ..state.weights import save_weights
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class WeightsExporter(Callback):
    """At the end of the run, writes the sampling generator with the config and step in the file's metadata."""

    def __init__(self, filename: str = GENERATOR) -> None:
        self.filename = filename

    def on_fit_end(self, trainer: "GANTrainer") -> None:
        if trainer.accelerator.is_main_process:
            metadata = {"config": trainer.config.to_dict(), "step": trainer.step, "ema": trainer.ema is not None}
            save_weights(trainer.sampling_generator(), trainer.output_dir / self.filename, metadata)
