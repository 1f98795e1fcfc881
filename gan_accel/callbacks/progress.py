"""A tqdm progress bar over steps, with the latest losses (local main process only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer


class ProgressBar(Callback):
    """Steps done of ``max_steps``; shows ``keys`` of the last logged row."""

    def __init__(self, keys: tuple[str, ...] = ("loss/D", "loss/G", "D(x)", "D(G(z))", "images/s")) -> None:
        self.keys = keys
        self.bar: Any = None

    def on_fit_start(self, trainer: "GANTrainer") -> None:
        self.bar = tqdm(total=trainer.config.max_steps, initial=trainer.step, desc="train", dynamic_ncols=True,
                        disable=not trainer.accelerator.is_local_main_process)

    def on_step_end(self, trainer: "GANTrainer") -> None:
        self.bar.update(1)

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        self.bar.set_postfix({k: f"{row[k]:.3g}" for k in self.keys if k in row})

    def on_close(self, trainer: "GANTrainer") -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
