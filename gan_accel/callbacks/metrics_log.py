"""The metrics log: one JSON line per log interval in ``<run>/metrics.jsonl``, written by the main process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..state.layout import METRICS, append_metrics, read_metrics
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

__all__ = ["MetricsLog", "MetricsLogger", "read_metrics"]  # read_metrics: the layout's reader, also named here


class MetricsLog:
    """Append-only JSON-lines file of metric rows; only the main process writes."""

    def __init__(self, path: str | os.PathLike, enabled: bool) -> None:
        self.path = Path(path)
        self.enabled = enabled

    def write(self, row: dict[str, Any]) -> None:
        """Append one row and flush it, so a crash loses at most the row being written."""
        if self.enabled:
            append_metrics(self.path, row)



class MetricsLogger(Callback):
    """Writes every logged row to ``metrics.jsonl`` (on resume, rows after the checkpoint were moved aside first)."""

    def __init__(self, filename: str = METRICS) -> None:
        self.filename = filename
        self.log: MetricsLog | None = None

    def setup(self, trainer: "GANTrainer") -> None:
        self.log = MetricsLog(trainer.output_dir / self.filename, enabled=trainer.accelerator.is_main_process)

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        self.log.write(row)
