"""Checkpoints on the ``on_checkpoint`` event: every ``checkpoint_every`` steps, at the end, on a stop request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DivergenceError, RunFolderError
from ..state.checkpoint import parameters_finite, save_checkpoint
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
            raise DivergenceError(
                f"refusing to write a checkpoint at step {state.step}: a network holds non-finite weights; "
                "the last complete checkpoint is kept"
            )
        marker = {"run_id": state.run_id, "config": trainer.config.to_dict()}
        try:
            path = save_checkpoint(trainer.accelerator, trainer.output_dir, state.step, trainer.state_dict(),
                                   self.keep, marker, keep_also=state.kept_checkpoints)
        except RunFolderError as error:
            raise RunFolderError(f"{error}. {trainer.checkpoint_note()}") from error
        trainer.control.checkpoint_written(path)
