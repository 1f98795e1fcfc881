"""Counts the updates the fp16 GradScaler skips, per network, without reading the device.

Under fp16 an update whose gradients overflow is skipped inside ``scaler.step`` and the scale is
halved in ``scaler.update``; nothing else tells. (Accelerate's ``step_was_skipped`` misses it for
fused optimizers: GradScaler calls their ``step()`` with ``found_inf`` and the kernel skips.) The
scale after an update is below the scale before it exactly when the update overflowed (growth only
raises it), so the count is one compare and one add on the device per update, read at log rows as
``skipped_fp16/<net>``. The skipped update still uses up its step of the learning-rate schedule
(engine/schedules.py), as a divergence-guard skip does, so the count is what says it happened.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


class Fp16Skips:
    """``before()`` ahead of an update, ``after(name, token)`` once it is done; ``metrics()`` at log rows."""

    def __init__(self, scaler: Any, names: Iterable[str]) -> None:
        self.scaler = scaler
        self._counts: dict[str, Any] = {name: 0 for name in names}

    @property
    def active(self) -> bool:
        return self.scaler is not None and getattr(self.scaler, "is_enabled", lambda: True)()

    def before(self) -> torch.Tensor | None:
        """The scale ahead of the update (a device copy), or None without a scaler."""
        scale = getattr(self.scaler, "_scale", None) if self.active else None
        return None if scale is None else scale.detach().clone()

    def after(self, name: str, before: torch.Tensor | None) -> None:
        scale = getattr(self.scaler, "_scale", None)
        if before is None or scale is None:
            return
        self._counts[name] = self._counts.get(name, 0) + (scale < before).to(torch.int64)

    def metrics(self) -> dict[str, int]:
        """``{"skipped_fp16/<net>": count}`` since the run started (a host read); empty without a scaler."""
        if not self.active:
            return {}
        return {f"skipped_fp16/{name}": int(count) for name, count in self._counts.items()}

    def state_dict(self) -> dict[str, int]:
        return {name: int(count) for name, count in self._counts.items()}

    def load_state_dict(self, state: dict[str, int] | None) -> None:
        for name, count in (state or {}).items():
            self._counts[name] = int(count)
