"""What a dataloader batch may look like, and how the engine reads real samples (and labels) from it."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import torch

IMAGE_KEYS = ("image", "images", "pixel_values", "img")
LABEL_KEYS = ("label", "labels", "class_labels", "y")


class RealBatch(NamedTuple):
    """Real samples of one micro-batch and their integer labels (``None`` when the data has none)."""

    x: torch.Tensor
    labels: torch.Tensor | None


def split_batch(batch: Any) -> RealBatch:
    """Read a batch: a tensor, an ``(x,)`` or ``(x, labels)`` tuple/list, or a dict with an image and a label key.

    A tuple of three or more is refused (as the docs say: anything else is refused): which item would be
    the labels is a guess (``(x, labels, index)``, ``(x, mask, labels)``), and a wrong guess trains a
    conditional run on the wrong classes without a word.
    """
    if isinstance(batch, torch.Tensor):
        return RealBatch(batch, None)
    if isinstance(batch, Sequence) and not isinstance(batch, str) and batch and isinstance(batch[0], torch.Tensor):
        if len(batch) > 2:
            raise TypeError(
                f"unsupported batch: a {type(batch).__name__} of {len(batch)} items, but the dataloader must yield "
                "a tensor, an (x, labels) tuple/list, or a dict with one of the keys "
                f"{list(IMAGE_KEYS)}: drop the other items in the dataset or in a collate_fn, or yield a dict "
                f"(an image key, a label key {list(LABEL_KEYS)}; other keys are ignored)")
        labels = batch[1] if len(batch) > 1 and isinstance(batch[1], torch.Tensor) else None
        return RealBatch(batch[0], labels)
    if isinstance(batch, Mapping):
        for key in IMAGE_KEYS:
            if isinstance(batch.get(key), torch.Tensor):
                labels = next((batch[k] for k in LABEL_KEYS if isinstance(batch.get(k), torch.Tensor)), None)
                return RealBatch(batch[key], labels)
    raise TypeError(
        f"unsupported batch of type {type(batch).__name__}: the dataloader must yield a tensor, "
        f"an (x, labels) tuple/list, or a dict with one of the keys {list(IMAGE_KEYS)}"
    )


def extract_images(batch: Any) -> torch.Tensor:
    """The real samples of a batch (see :func:`split_batch`)."""
    return split_batch(batch).x
