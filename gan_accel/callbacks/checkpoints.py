"""Checkpoints on the ``on_checkpoint`` event: every ``checkpoint_every`` steps, at the end, on a stop request."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import DivergenceError, RunFolderError
from ..storage.checkpoint import non_finite_parts, parameters_finite, save_checkpoint
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class Checkpointer(Callback):
    """Writes a complete checkpoint (collective: every process) and keeps the newest ``keep``, plus
    the kept ones (``trainer.state.kept_checkpoints``: the best one, named by the evaluator)."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep

    def on_checkpoint(self, trainer: "GANTrainer") -> None:
        state = trainer.state
        if state.last_checkpoint is not None and state.last_checkpoint_step == state.step:
            return  # this step is saved already
        if trainer.guard is not None:  # its counters live on the device: a divergence is noticed here at the latest
            trainer.guard.check(state.step)
        if not parameters_finite(*trainer.networks.values()):
            raise DivergenceError(refusal(trainer))
        marker = {"run_id": state.run_id, "config": trainer.config.to_dict()}

        def published(path: Path) -> None:  # complete on disk: what the line names if a process is lost just after
            state.last_checkpoint, state.last_checkpoint_step = path, state.step

        try:
            path = save_checkpoint(trainer.accelerator, trainer.output_dir, state.step, trainer.state_dict(),
                                   self.keep, marker, keep_also=state.kept_checkpoints, published=published)
        except RunFolderError as error:
            raise RunFolderError(f"{error}. {trainer.checkpoint_note()}") from error
        trainer.control.checkpoint_written(path)


def refusal(trainer: "GANTrainer") -> str:
    """Why a checkpoint is refused: what is non-finite, where it likely came from, how the run goes on."""
    parts = non_finite_parts(trainer.networks, trainer.accelerator.unwrap_model)
    what = "; ".join(parts) or "a network's weights or buffers"
    guard = trainer.guard
    data = guard.data_note() if guard is not None else ""
    if guard is None:
        cause = ("nan_guard is off, so a non-finite loss (often a NaN or inf in the data) reached them; continue "
                 "with nan_guard=True (the default): it skips such updates and puts the buffers back")
        reals = [micro.real for micro in trainer.runner.window]
        bad = sum(int(torch.count_nonzero(~torch.isfinite(r))) for r in reals if r.is_floating_point())
        if bad:
            data = f"the last real batch holds {bad} NaN/inf value(s), likely where they came from"
    elif parts and all("'s buffers " in part for part in parts):
        cause = ("the guard's skipped updates put buffers back, so something outside a guarded update changed them "
                 "(a callback or your own code calling a network in training mode on non-finite data?)")
    else:
        cause = "the divergence guard did not catch it (a network changed outside a guarded update?)"
    if data:
        cause = f"{data}; {cause}"
    return (f"refusing to write a checkpoint at step {trainer.state.step}: {what} hold non-finite values. {cause}. "
            f"{trainer.checkpoint_note()}")
