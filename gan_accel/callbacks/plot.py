"""``training_plot.png``: the run's metrics as line charts, redrawn at every sample interval and at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plots import PLOT_FILE, plot_metrics
from .metrics_log import read_metrics
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class TrainingPlot(Callback):
    """Draws the metrics log (``metrics.jsonl``, all rows of the run so far, resumes included) to
    ``<run>/training_plot.png`` on the main process, and records it as the run's file."""

    name = "plot"

    def __init__(self, filename: str = PLOT_FILE) -> None:
        self.filename = filename

    def on_sample(self, trainer: "GANTrainer") -> None:
        self.draw(trainer)

    def on_fit_end(self, trainer: "GANTrainer") -> None:
        self.draw(trainer)

    def draw(self, trainer: "GANTrainer") -> None:
        """Redraw the plot from the metrics log (nothing before the first row, or without the log)."""
        if not trainer.accelerator.is_main_process:
            return
        logger = trainer.callbacks.get("metrics_log")
        log = trainer.output_dir / getattr(logger, "filename", "metrics.jsonl")
        rows = read_metrics(log) if log.is_file() else []
        if rows:
            trainer.run_folder.record(plot_metrics(rows, trainer.output_dir / self.filename), trainer.step)
