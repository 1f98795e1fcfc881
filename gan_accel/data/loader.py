"""A fast in-memory loader for uint8 images.

The fast path keeps the whole data set in memory as uint8 (47 MB for MNIST) and converts to float in
[-1, 1] once per *batch*. torchvision's usual path builds a PIL image and runs ``ToTensor`` +
``Normalize`` for every item, which costs more CPU time than a small GAN step on a GPU.

``make_dataloader`` returns a real ``torch.utils.data.DataLoader`` so ``accelerator.prepare`` can shard
it like any other loader; all state lives in the dataset and ``collate_fn``, which ``prepare`` keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset


def uint8_to_float(images: Tensor) -> Tensor:
    """uint8 images in [0, 255] -> float32 in [-1, 1] (same as ``ToTensor`` + ``Normalize(0.5, 0.5)``)."""
    return images.float().div(127.5).sub(1)


class UInt8ImageDataset(Dataset):
    """Map-style dataset over uint8 images (N, C, H, W) and labels (N,), with a batched fetch.

    ``__getitems__`` is PyTorch's batched-fetch hook: when a dataset defines it, the DataLoader's map
    fetcher calls it once per batch with the list of indices instead of calling ``__getitem__`` per
    index, so a batch is one ``index_select`` rather than B Python calls plus a stack.
    """

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(f"labels must be (N,) with N={images.shape[0]}, got {tuple(labels.shape)}")
        self.images = images.contiguous()
        self.labels = labels.to(torch.int64)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.images.index_select(0, idx), self.labels.index_select(0, idx)


def collate_uint8_batch(batch: Any) -> tuple[Tensor, Tensor]:
    """Turn a fetched batch into ``(float32 images in [-1, 1], int64 labels)``.

    Accepts the ``(images, labels)`` pair from ``__getitems__`` or, should a wrapper hide that hook,
    a list of per-item pairs. Module-level (not a lambda) so worker processes can pickle it.
    """
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], Tensor) and batch[0].dim() == 4:
        images, labels = batch
    else:
        images = torch.stack([item[0] for item in batch])
        labels = torch.stack([torch.as_tensor(item[1]) for item in batch])
    return uint8_to_float(images), labels.to(torch.int64)


def make_dataloader(
    images_uint8: Tensor,
    labels: Tensor,
    batch_size: int,
    shuffle: bool = True,
    drop_last: bool = True,
    num_workers: int = 0,
    *,
    generator: torch.Generator | None = None,
    pin_memory: bool = False,
) -> DataLoader:
    """Fast loader over uint8 images: batches of ``(float32 (B,C,H,W) in [-1, 1], int64 (B,))``.

    A genuine ``DataLoader`` on purpose: ``accelerator.prepare`` only shards DataLoaders, and it
    rebuilds them from ``dataset``/``collate_fn``/sampler, which is where all the state is.
    ``drop_last=True`` by default because GAN steps with BatchNorm dislike a tiny final batch.
    Pass a seeded ``generator`` for a reproducible shuffle.
    """
    return DataLoader(
        UInt8ImageDataset(images_uint8, labels),
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
        collate_fn=collate_uint8_batch,
        generator=generator,
        pin_memory=pin_memory,
        # Keeping workers alive avoids re-sending the image tensor to fresh workers every epoch.
        persistent_workers=num_workers > 0,
    )
