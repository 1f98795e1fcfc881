"""Training metrics without per-step host syncs, written as JSON lines.

Values are summed as detached device tensors every micro-batch and read back (``.tolist()``, the
only host sync) once per log interval, after averaging across processes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from .files import atomic_path


class RunningMeans:
    """Sums of scalar tensors per key, reduced to means across steps and processes on demand."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}

    def add(self, key: str, value: torch.Tensor) -> None:
        """Add one detached scalar observation (stays on its device: no sync)."""
        value = value.detach().float()
        self._sums[key] = self._sums[key] + value if key in self._sums else value.clone()
        self._counts[key] = self._counts.get(key, 0) + 1

    def state_dict(self) -> dict[str, Any]:
        return {k: (self._sums[k].cpu(), self._counts[k]) for k in self._sums}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self._sums = {k: total.to(device) for k, (total, _) in state.items()}
        self._counts = {k: count for k, (_, count) in state.items()}

    def reduce(self, accelerator: Accelerator) -> dict[str, float]:
        """Means since the last call, averaged over processes; clears the sums. Collective: call on every rank."""
        if not self._sums:
            return {}
        keys = sorted(self._sums)
        local = torch.stack([self._sums[k] / self._counts[k] for k in keys])
        means = accelerator.reduce(local, reduction="mean").tolist()
        self._sums.clear()
        self._counts.clear()
        return dict(zip(keys, means))


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


def truncate_metrics(path: str | os.PathLike, last_step: int) -> None:
    """Drop rows after ``last_step`` (written by a run that crashed after its last checkpoint)."""
    path = Path(path)
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a row cut short by the crash
            continue
        if row["step"] <= last_step:
            keep.append(line)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in keep))
