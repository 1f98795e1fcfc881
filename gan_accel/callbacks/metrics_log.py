"""The metrics log: one JSON line per log interval in ``<run>/metrics.jsonl``, written by the main process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class MetricsLog:
    """Append-only JSON-lines file of metric rows; only the main process writes."""

    def __init__(self, path: str | os.PathLike, enabled: bool) -> None:
        self.path = Path(path)
        self.enabled = enabled

    def write(self, row: dict[str, Any]) -> None:
        """Append one row and flush it, so a crash loses at most the row being written."""
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Load a metrics log written by :class:`MetricsLog`."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


class MetricsLogger(Callback):
    """Writes every logged row to ``metrics.jsonl`` (on resume, rows after the checkpoint were moved aside first)."""

    name = "metrics_log"

    def __init__(self, filename: str = "metrics.jsonl") -> None:
        self.filename = filename
        self.log: MetricsLog | None = None

    def setup(self, trainer: "GANTrainer") -> None:
        self.log = MetricsLog(trainer.output_dir / self.filename, enabled=trainer.accelerator.is_main_process)

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        self.log.write(row)
