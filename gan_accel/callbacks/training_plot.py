"""``training_plot.png``: the run's metrics as line charts, redrawn at every sample interval and at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..pictures.training_plot import plot_metrics
from ..state.layout import METRICS, TRAINING_PLOT, read_metrics_tolerant
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class TrainingPlot(Callback):
    """Draws the metrics log (``metrics.jsonl``, all rows of the run so far, resumes included) to
    ``<run>/training_plot.png`` on the main process, and records it as the run's file."""

    def __init__(self, filename: str = TRAINING_PLOT) -> None:
        self.filename = filename

    def on_sample(self, trainer: "GANTrainer") -> None:
        self.draw(trainer)

    def on_fit_end(self, trainer: "GANTrainer") -> None:
        self.draw(trainer)

    def draw(self, trainer: "GANTrainer") -> None:
        """Redraw the plot from the metrics log (nothing before the first row, or without the log)."""
        if not trainer.accelerator.is_main_process:
            return
        logger = trainer.callbacks.get("metrics_logger")
        log = trainer.output_dir / getattr(logger, "filename", METRICS)
        rows = [row for row in read_metrics_tolerant(log)[0] if isinstance(row, dict) and "step" in row]  # a row cut
        # short by a crash is skipped (info names it)
        if rows:
            plot_metrics(rows, trainer.output_dir / self.filename)
