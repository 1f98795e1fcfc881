"""``training_plot.png``: the run's metrics as line charts, redrawn at every sample interval and at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..pictures.training_plot import plot_metrics, run_rows
from ..storage.layout import METRICS, TRAINING_PLOT
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class TrainingPlot(Callback):
    """Draws the metrics log (``metrics.jsonl``, all rows of the run so far, resumes included) to
    ``<run>/training_plot.png`` on the main process."""

    def __init__(self, filename: str = TRAINING_PLOT) -> None:
        self.filename = filename

    def on_sample(self, trainer: "GANTrainer") -> None:
        """Redraw the plot from the metrics log (nothing before the first row, or without the log)."""
        if trainer.accelerator.is_main_process:
            logger = trainer.callbacks.get("metrics_logger")
            rows = run_rows(trainer.output_dir / getattr(logger, "filename", METRICS))
            if rows:
                plot_metrics(rows, trainer.output_dir / self.filename)

    on_fit_end = on_sample
