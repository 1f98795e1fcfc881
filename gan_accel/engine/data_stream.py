"""The endless stream of real batches, epoch after epoch, with its position for exact mid-epoch resume."""

from __future__ import annotations

from typing import Any, Iterator

import torch
from accelerate import Accelerator
from torch.utils.data import IterableDataset

from ..batch import RealBatch, split_batch
from ..errors import PreflightError


class DataStream:
    """Batches of a prepared dataloader; ``epoch`` and ``batches_in_epoch`` say where it stands. Data mistakes
    that show later in a run (a batch of another shape, mixed sizes, an epoch that runs dry) are one line."""

    def __init__(self, dataloader: Any, accelerator: Accelerator) -> None:
        self.dataloader = dataloader
        self.accelerator = accelerator
        self.epoch = 0
        self.batches_in_epoch = 0  # position in the current epoch, for mid-epoch resume
        self.sample_shape: tuple[int, ...] | None = None  # the first batch's (C, H, W): every batch must match
        self._last_epoch_batches: int | None = None  # batches the previous epoch yielded (in this process)

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
                batch = self._next(iterator)
            if batch is None and self.batches_in_epoch == 0:
                raise self._ran_dry()
            start = self.batches_in_epoch
            while batch is not None:
                self.batches_in_epoch += 1
                real = split_batch(batch)
                if real.x.shape[1:] != self.sample_shape:
                    self._check_shape(real.x)
                yield real
                batch = self._next(iterator)
            self._last_epoch_batches = self.batches_in_epoch - start if start == 0 else None
            self.epoch += 1
            self.batches_in_epoch = 0

    def _next(self, iterator: Iterator[Any]) -> Any:
        """The next batch, or None at the end of the epoch; the data's known mistakes as one line."""
        try:
            return next(iterator, None)
        except ValueError as error:
            if "Batch does not contain any data" in str(error):  # Accelerate's dispatcher: an epoch with none
                raise self._ran_dry() from None
            raise
        except RuntimeError as error:
            if "stack expects each tensor to be equal size" in str(error):  # the default collate_fn
                reason = str(error).strip().splitlines()[-1]
                raise PreflightError(  # no batch number: Accelerate's loader reads one batch ahead
                    f"a batch of epoch {self.epoch} mixes samples of different sizes "
                    f"({reason}): every sample must have the same shape; resize or crop them in the dataset "
                    "(e.g. torchvision.transforms.Resize and CenterCrop)") from None
            raise

    def _ran_dry(self) -> PreflightError:
        if self.epoch > 0 or self._last_epoch_batches:
            before = f" (the one before yielded {self._last_epoch_batches})" if self._last_epoch_batches else ""
            return PreflightError(
                f"the training data yielded no batch in epoch {self.epoch}{before}: an IterableDataset must start "
                "over in every epoch (its __iter__ is called once per epoch: a generator or an open file it reads "
                "once runs dry after the first); make __iter__ yield the items again, or set max_steps within the "
                "first epoch")
        return PreflightError(f"the training data yielded no batch in epoch {self.epoch}: an empty "
                              "IterableDataset, or fewer items than one batch with drop_last=True")

    def _check_shape(self, x: torch.Tensor) -> None:
        """The first batch sets the samples' shape; a later batch of another one is refused in one line."""
        if self.sample_shape is None:
            self.sample_shape = tuple(x.shape[1:])
            return
        raise PreflightError(
            f"batch {self.batches_in_epoch} of epoch {self.epoch} holds samples of shape {tuple(x.shape[1:])}, but "
            f"the run's samples are {self.sample_shape} (its first batch): every sample must have the same shape; "
            "resize or crop them in the dataset (e.g. torchvision.transforms.Resize and CenterCrop)")

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
