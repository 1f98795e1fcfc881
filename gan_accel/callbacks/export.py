"""The finished run's G in ``<run>/generator/``: the format ``gan-accel export`` copies (the EMA when kept)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..storage.layout import GENERATOR
from ..storage.weights import generator_config, save_generator
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class WeightsExporter(Callback):
    """At the end of the run, writes the sampling generator as ``config.json`` + ``model.safetensors``."""

    def on_fit_end(self, trainer: "GANTrainer") -> None:
        if trainer.accelerator.is_main_process:
            ema = trainer.ema is not None
            config = generator_config(trainer.config.to_dict(), trainer.step, ema, ema, trainer.output_dir)
            save_generator(trainer.output_dir / GENERATOR, trainer.sampling_generator(), config)
