"""Running means of scalar training metrics, kept on the device between log intervals.

Values are summed as detached device tensors every micro-batch and read back (``.tolist()``, the
only host sync) once per log interval, after averaging across processes.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator


class RunningMeans:
    """Sums of scalar tensors per key, reduced to means across steps and processes on demand."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int | torch.Tensor] = {}

    def add(self, key: str, value: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Add one detached scalar observation (stays on its device: no sync). ``keep``: a 0-dim bool
        device tensor; when False the observation is left out (a device-side select, no sync)."""
        value = value.detach().float()
        count: int | torch.Tensor = 1
        if keep is not None:
            value, count = torch.where(keep, value, 0.0), keep.float()
        self._sums[key] = self._sums[key] + value if key in self._sums else value.clone()
        self._counts[key] = self._counts.get(key, 0) + count

    def state_dict(self) -> dict[str, Any]:
        return {k: (self._sums[k].cpu(), _host(self._counts[k])) for k in self._sums}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self._sums = {k: total.to(device) for k, (total, _) in state.items()}
        self._counts = {k: count for k, (_, count) in state.items()}

    def reduce(self, accelerator: Accelerator) -> dict[str, float]:
        """Means since the last call, averaged over processes; clears the sums. Collective: call on every rank.

        Every rank must hold the same keys (they do: every rank runs the same phases).
        """
        if not self._sums:
            return {}
        keys = sorted(self._sums)
        local = torch.stack([self._sums[k] / self._counts[k] for k in keys])
        means = accelerator.reduce(local, reduction="mean").tolist()
        self._sums.clear()
        self._counts.clear()
        return dict(zip(keys, means))


def _host(count: int | torch.Tensor) -> int:
    return int(count.item()) if isinstance(count, torch.Tensor) else count
