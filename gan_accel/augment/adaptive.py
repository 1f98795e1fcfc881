"""ADA's controller of the augmentation probability p (Karras et al., 2020, section 3).

``r_t = E[sign(D(x_real))]`` (for a relativistic loss the engine passes D(x_real) - D(G(z)), whose sign
says which of each pair D prefers), summed over processes every ``interval`` updates, moves p by
``sign(r_t - target) * images / (ada_kimg * 1000)``, clamped to [0, p_max]: above the target D is
overfitting, so more augmentation. Signs and counts are summed as integers on the device (no host read
per step, no round-off; a NaN logit counts as nothing), so every process holds the same p, bit for bit.
``reduce`` sums a tensor over processes (``lambda t: accelerator.reduce(t, "sum")``); without it, local.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from .base import Augment

Reduce = Callable[[Tensor], Tensor]


class AdaptiveP:
    """Adjusts ``p`` (and ``augment.p``) from D's real logits: :meth:`observe` them, :meth:`tick` on every
    process (p moves every ``interval`` ticks, a collective)."""

    def __init__(self, augment: Augment | None = None, *, target: float = 0.6, interval: int = 4,
                 ada_kimg: float = 500.0, p: float = 0.0, p_max: float = 0.99, reduce: Reduce | None = None,
                 device: torch.device | str | None = None) -> None:
        if not 0 < p_max < 1:
            raise ValueError(f"p_max={p_max!r} must be in (0, 1): at p = 1 every transform always applies, "
                             "and D's augmentations leak into G's samples")
        if not -1 <= target <= 1:
            raise ValueError(f"target={target!r}: r_t = E[sign(D(real))] lies in [-1, 1]")
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval={interval!r} must be an integer >= 1 (D updates between adjustments)")
        if not ada_kimg > 0:
            raise ValueError(f"ada_kimg={ada_kimg!r} must be > 0 (thousands of images for p to go from 0 to 1)")
        self.augment, self.reduce = augment, reduce
        self.target, self.interval, self.ada_kimg, self.p_max = float(target), interval, float(ada_kimg), float(p_max)
        self.p = 0.0
        self.rt: float | None = None  # the last interval's statistic (None before the first update)
        self.ticks = 0  # D updates since the last adjustment
        self.updates = 0
        # (sum of sign(logit), number of logits) over the interval, int64 on the logits' device; ``device``
        # (the engine's) is where an interval without logits reduces its zeros (NCCL needs a CUDA tensor).
        self._stats: Tensor | None = None
        self.device = None if device is None else torch.device(device)
        self._set_p(p)

    def observe(self, real_logits: Tensor) -> None:
        """Add D's logits on real images to the interval's statistic (on the device; no host read)."""
        logits = real_logits.detach()
        stats = torch.stack([(logits > 0).sum() - (logits < 0).sum(), (~logits.isnan()).sum()])  # int64: exact
        # (a partial interval loaded from a checkpoint may sit on the CPU)
        self._stats = stats if self._stats is None else self._stats.to(stats.device) + stats

    def tick(self) -> bool:
        """One D update done: every ``interval``-th call updates p (a collective: call on every process)."""
        self.ticks += 1
        if self.ticks < self.interval:
            return False
        self.update()
        return True

    def update(self, reduce: Reduce | None = None) -> float:
        """Reduce the interval's statistic over processes, move p, start a new interval; returns p."""
        reduce = reduce or self.reduce
        local = self._stats if self._stats is not None else torch.zeros(2, dtype=torch.int64, device=self.device)
        signs, count = (reduce(local) if reduce is not None else local).tolist()
        self._stats, self.ticks = None, 0
        if count > 0:
            self.rt = signs / count
            step = count / (self.ada_kimg * 1000)
            direction = (self.rt > self.target) - (self.rt < self.target)
            self._set_p(self.p + direction * step)
        self.updates += 1
        return self.p

    def _set_p(self, p: float) -> None:
        self.p = min(max(float(p), 0.0), self.p_max)
        if self.augment is not None:
            self.augment.p = self.p

    def state_dict(self) -> dict[str, Any]:
        """p, the last r_t and this process's partial interval (the signs are read from the device)."""
        signs, count = (0, 0) if self._stats is None else self._stats.tolist()
        return {"p": self.p, "rt": self.rt, "ticks": self.ticks, "updates": self.updates, "signs": signs,
                "count": count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` exactly (``p`` may be a float or a 0-dim tensor)."""
        p = state["p"]
        self.p = float(p.item() if isinstance(p, Tensor) else p)  # not clamped: the saved value, bit for bit
        if self.augment is not None:
            self.augment.p = self.p
        self.rt = None if state["rt"] is None else float(state["rt"])
        self.ticks, self.updates = int(state["ticks"]), int(state["updates"])
        partial = (int(state["signs"]), int(state["count"]))
        self._stats = None if partial == (0, 0) else torch.tensor(partial, dtype=torch.int64, device=self.device)
