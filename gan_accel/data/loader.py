"""The datasets and the collate behind every loader: uint8 images in, float32 batches in [-1, 1] out.

The data set stays uint8 (in memory, or memory-mapped from the image cache) and is converted to float once
per *batch*: torchvision's per-item PIL path + ``ToTensor`` costs more CPU time than a small GAN step on a GPU.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, get_worker_info

from ..errors import DataError
from ..storage.reading import load_array
from . import image_decode
from .image_decode import Preprocessing
from .image_scan import skip_reason
from .image_sources import ImageSource

_REPLACEMENT_TRIES = 16  # consecutive unreadable items before the per-item path gives up
_FAILURES_LOGGED = 5  # per process: the first few files that turned bad are named on stderr


def uint8_to_float(images: Tensor) -> Tensor:
    """uint8 images in [0, 255] -> float32 in [-1, 1] (same as ``ToTensor`` + ``Normalize(0.5, 0.5)``)."""
    return images.float().div(127.5).sub(1)


def _rng(private: torch.Generator) -> torch.Generator | None:
    """Augmentation's generator: the worker's own inside a DataLoader worker, else ``private``; never the
    main process's global one (drawing from it would shift the training noise)."""
    return None if get_worker_info() is not None else private


def random_window(images: Tensor, lengths: Tensor, portrait: Tensor, resolution: int,
                  generator: torch.Generator | None) -> Tensor:
    """R x R windows at random offsets of uint8 strips (B, C, R, W) whose first ``lengths`` columns are real;
    strips stored transposed (``portrait``) are turned back."""
    b, c = images.shape[:2]
    room = (lengths.to(torch.float64) - resolution + 1).clamp_min(1)
    offsets = (torch.rand(b, generator=generator, dtype=torch.float64) * room).long()
    index = (offsets[:, None] + torch.arange(resolution))[:, None, None, :].expand(b, c, resolution, resolution)
    out = torch.gather(images, 3, index)
    if bool(portrait.any()):
        out[portrait] = out[portrait].transpose(-1, -2).contiguous()
    return out


class UInt8ImageDataset(Dataset):
    """uint8 images (N, C, H, W), in memory or memory-mapped from a ``.npy`` file, with optional labels (N,).

    ``__getitems__`` (PyTorch's batched fetch) makes a batch one gather rather than B calls plus a stack.
    With ``strips`` (``crop="random"``: each row's real length and orientation) a batch is an R x R window
    of each strip, drawn anew. A file-backed array is opened lazily in each process, never pickled.
    """

    def __init__(self, images: Tensor | str | os.PathLike, labels: Any = None, *, strips: np.ndarray | None = None,
                 resolution: int = 0, seed: int = 0) -> None:
        self.path: Path | None = None
        self._array: Tensor | np.ndarray | None = None
        if isinstance(images, Tensor):
            if images.dtype != torch.uint8 or images.dim() != 4:
                raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
            if labels is not None and (labels.dim() != 1 or labels.shape[0] != images.shape[0]):
                raise ValueError(f"labels must be (N,) with N={images.shape[0]}, got {tuple(labels.shape)}")
            self._array = images.contiguous()
        else:
            self.path = Path(images)
        self.labels = None if labels is None else torch.as_tensor(labels).to(torch.int64)
        self.strips = None if strips is None else torch.as_tensor(strips.astype(np.int64))
        self.resolution = resolution
        self.generator = torch.Generator().manual_seed(seed)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None} if self.path is not None else self.__dict__

    @property
    def array(self) -> Tensor | np.ndarray:
        """The images: the tensor, or the read-only memory map of the file."""
        if self._array is None:
            self._array = load_array(self.path, mmap=True)
        return self._array

    def __len__(self) -> int:
        return int(self.array.shape[0])

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor | None]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        array = self.array
        if isinstance(array, Tensor):
            images = array.index_select(0, idx)
        else:  # fancy indexing copies: the batch owns its memory
            images = torch.from_numpy(array[idx.numpy()])
        if self.strips is not None:
            strips = self.strips.index_select(0, idx)
            images = random_window(images, strips[:, 0], strips[:, 1].bool(), self.resolution, _rng(self.generator))
        return images, None if self.labels is None else self.labels.index_select(0, idx)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor | None]:
        images, labels = self.__getitems__([index])
        return images[0], None if labels is None else labels[0]


class DecodedImages(Dataset):
    """Decodes each item when it is drawn (sets larger than the memory budget), in DataLoader workers.

    A file that fails now although the scan read it is flagged in shared memory (every worker skips it,
    :attr:`failures` counts it once) and the next readable item is returned instead: a batch keeps its size.
    """

    def __init__(self, source: ImageSource, names: Sequence[str], labels: np.ndarray | None, prep: Preprocessing,
                 seed: int = 0) -> None:
        import multiprocessing

        self.source, self.names, self.prep = source, list(names), prep
        self.labels = None if labels is None else torch.as_tensor(labels, dtype=torch.int64)
        self.generator = torch.Generator().manual_seed(seed)
        # Shared memory: inherited by the workers, whatever their start method.
        self.bad = multiprocessing.get_context("spawn").RawArray("b", max(1, len(self.names)))
        self._logged = 0

    @property
    def failures(self) -> int:
        """Distinct files that failed since the scan (counted over all worker processes)."""
        return int(np.frombuffer(self.bad, dtype=np.int8).sum())

    def __len__(self) -> int:
        return len(self.names)

    def _decode(self, index: int) -> Tensor:
        images = torch.from_numpy(image_decode.decode_image(self.source.open(self.names[index]), self.prep))
        if self.prep.crop == "random":
            portrait = images.shape[1] > images.shape[2]
            strip = images.transpose(1, 2) if portrait else images
            images = random_window(strip[None].contiguous(), torch.tensor([strip.shape[-1]]), torch.tensor([portrait]),
                                   self.prep.resolution, _rng(self.generator))[0]
        return images

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor | None]:
        tries = 0
        for step in range(len(self.names)):
            current = (index + step) % len(self.names)
            if self.bad[current]:
                continue
            try:
                images = self._decode(current)
            except MemoryError:
                raise
            except Exception as error:  # any Pillow error on a file that changed: skip it, count it
                self.bad[current] = 1
                tries += 1
                if tries >= _REPLACEMENT_TRIES:
                    break
                if self._logged < _FAILURES_LOGGED:
                    self._logged += 1
                    print(f"gan_accel: warning: skipped {self.names[current]} ({skip_reason(error)}; it was readable "
                          "when the data was scanned)", file=sys.stderr)
                continue
            return images, None if self.labels is None else self.labels[current]
        raise DataError(f"{tries} images in a row from {self.names[index]} on can no longer be read (the data is "
                        f"changing under training): restore {self.source.description} and resume")


class UInt8Collate:
    """Fetched items (the pair of ``__getitems__`` or a list of per-item pairs) -> ``(float32 (B, C, H, W) in
    [-1, 1], int64 labels)``, or the images alone without labels. ``random_flip`` mirrors each image with
    probability 1/2. A class, not a closure, so DataLoader workers can pickle it.
    """

    def __init__(self, has_labels: bool = True, random_flip: bool = False, seed: int = 0) -> None:
        self.has_labels, self.random_flip = has_labels, random_flip
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch: Any) -> Tensor | tuple[Tensor, Tensor]:
        if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], Tensor) and batch[0].dim() == 4:
            images, labels = batch
        else:  # per-item fetches: a list of (image, label)
            images = torch.stack([item[0] for item in batch])
            labels = torch.stack([torch.as_tensor(item[1]) for item in batch]) if self.has_labels else None
        if self.random_flip:
            flip = torch.rand(images.shape[0], generator=_rng(self.generator)) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
        # uint8_to_float's arithmetic, in place: one float allocation per batch instead of three
        x = images.float().div_(127.5).sub_(1)
        return (x, labels.to(torch.int64)) if self.has_labels else x


def make_dataloader(images_uint8: Tensor, labels: Tensor, batch_size: int, shuffle: bool = True, drop_last: bool = True,
                    num_workers: int = 0, *, generator: torch.Generator | None = None) -> DataLoader:
    """Fast loader over uint8 images: batches of ``(float32 (B,C,H,W) in [-1, 1], int64 (B,))``.

    A genuine ``DataLoader``: ``accelerator.prepare`` shards only those, rebuilding them from the dataset and
    ``collate_fn``, where all the state is. ``drop_last`` because BatchNorm dislikes a tiny final batch.
    """
    # Keeping workers alive avoids re-sending the image tensor to fresh workers every epoch.
    return DataLoader(UInt8ImageDataset(images_uint8, labels), batch_size=batch_size, shuffle=shuffle,
                      drop_last=drop_last, num_workers=num_workers, collate_fn=UInt8Collate(), generator=generator,
                      persistent_workers=num_workers > 0)
