"""The metrics log: one JSON line per log interval in ``<run>/metrics.jsonl``, written by the main process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..storage.layout import METRICS, append_metrics, read_metrics
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

__all__ = ["MetricsLogger", "read_metrics"]  # read_metrics: the layout's reader, also named here


class MetricsLogger(Callback):
    """Writes every logged row to ``metrics.jsonl`` on the main process."""

    def __init__(self, filename: str = METRICS) -> None:
        self.filename = filename

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        if trainer.accelerator.is_main_process:  # appended and flushed: a crash loses at most this row
            append_metrics(trainer.output_dir / self.filename, row)
