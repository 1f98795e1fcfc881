"""The endless stream of real batches, epoch after epoch, with its position for exact mid-epoch resume."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from accelerate import Accelerator
from torch.utils.data import IterableDataset

from ..batch import RealBatch, split_batch
from ..errors import PreflightError


class DataStream:
    """Batches of a prepared dataloader; ``epoch`` and ``batches_in_epoch`` say where it stands."""

    def __init__(self, dataloader: Any, accelerator: Accelerator) -> None:
        self.dataloader = dataloader
        self.accelerator = accelerator
        self.epoch = 0
        self.batches_in_epoch = 0  # position in the current epoch, for mid-epoch resume

    def __iter__(self) -> Iterator[RealBatch]:
        """Endless batches (``set_epoch`` reshuffles through the seedable sampler)."""
        loader = self.dataloader
        if self.batches_in_epoch and isinstance(getattr(loader, "dataset", None), IterableDataset):
            self.accelerator.print(
                f"gan_accel: note: the data is an IterableDataset, so resuming mid-epoch reads and skips "
                f"{self.batches_in_epoch} batches; the run continues exactly only if the dataset yields the "
                "same items in the same order for a given epoch (set_epoch)")
        while True:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(self.epoch)  # the seedable sampler's order is a function of (seed, epoch)
            current = loader
            if self.batches_in_epoch:  # resumed mid-epoch: the same order, minus what was consumed
                current = self.accelerator.skip_first_batches(loader, self.batches_in_epoch)
            iterator = iter(current)
            # Starting a DataLoader iterator draws a base seed from the global RNG. Keep that draw out
            # of the noise stream, so a run resumed mid-epoch draws the same noise as an uninterrupted one.
            with torch.random.fork_rng(devices=[]):
                batch = next(iterator, None)
            if batch is None and self.batches_in_epoch == 0:
                raise PreflightError(f"the training data yielded no batch in epoch {self.epoch}: an empty "
                                     "IterableDataset, or fewer items than one batch with drop_last=True")
            while batch is not None:
                self.batches_in_epoch += 1
                yield split_batch(batch)
                batch = next(iterator, None)
            self.epoch += 1
            self.batches_in_epoch = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
