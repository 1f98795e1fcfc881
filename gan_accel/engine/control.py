"""What a callback may read of the run (:class:`RunState`) and ask of it (:class:`Control`).

The trainer applies a callback's requests right after its handler, and acts on ``save_checkpoint`` and
``stop`` once the whole event has run (``GANTrainer._apply``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass
class RunState:
    """The run as the trainer knows it. Read it; only the trainer writes it.

    Attributes:
        step: steps completed (passes over the phase list; see :mod:`gan_accel.engine.phases`).
        run_id: the run's id, named in its checkpoints' ``COMPLETE`` (None before ``fit``).
        resumed_from: the checkpoint this run was resumed from, if any.
        last_checkpoint: the newest complete checkpoint of this run, and the step it was written at.
        kept_checkpoints: checkpoint folder names that are never pruned (e.g. the best one by evaluation).
    """

    step: int = 0
    run_id: str | None = None
    resumed_from: Path | None = None
    last_checkpoint: Path | None = None
    last_checkpoint_step: int | None = None
    kept_checkpoints: set[str] = field(default_factory=set)


class Control:
    """Requests of the callbacks, collected here and applied by the trainer."""

    def __init__(self) -> None:
        self.metrics: dict[str, Any] = {}
        self.keeps: list[tuple[str, bool]] = []  # (checkpoint name, keep or release), in the order asked
        self.written: Path | None = None
        self.checkpoint_requested = False
        self.stop_signal: int | None = None

    def log(self, values: Mapping[str, Any]) -> None:
        """Add ``values`` to the next metrics row (a later value of the same key replaces an earlier one)."""
        self.metrics.update(values)

    def save_checkpoint(self) -> None:
        """Write a checkpoint at this step after the current event (on every process: a collective)."""
        self.checkpoint_requested = True

    def keep_checkpoint(self, name: str) -> None:
        """Never prune the checkpoint folder ``name`` (``checkpoint_<step>``) while it is kept."""
        self.keeps.append((name, True))

    def release_checkpoint(self, name: str) -> None:
        """End :meth:`keep_checkpoint`: ``name`` is pruned like any other checkpoint."""
        self.keeps.append((name, False))

    def checkpoint_written(self, path: str | os.PathLike) -> None:
        """A complete checkpoint of the current step is at ``path`` (reported by the checkpoint writer)."""
        self.written = Path(path)

    def stop(self, signum: int) -> None:
        """Checkpoint and stop after this step, as a signal would (call on every process alike)."""
        self.stop_signal = signum
