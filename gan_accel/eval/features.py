"""Features of samples through a pluggable extractor (a classifier's penultimate layer, Inception, ...)."""

from __future__ import annotations

from typing import Any, Iterable, Protocol, Union

import torch
from torch import Tensor, nn

from ..batch import extract_images


class FeatureExtractor(Protocol):
    """Any callable mapping an image batch (N, C, H, W) in [-1, 1] to features (N, F)."""

    def __call__(self, images: Tensor) -> Tensor: ...


def _extractor_device(extractor: FeatureExtractor) -> torch.device | None:
    """The device of a module (or a bound method of one) extractor; None if it cannot be told."""
    module = extractor if isinstance(extractor, nn.Module) else getattr(extractor, "__self__", None)
    return next((param.device for param in module.parameters()), None) if isinstance(module, nn.Module) else None


def compute_features(extractor: FeatureExtractor, images: Union[Tensor, Iterable[Any]],
                     batch_size: int = 256) -> Tensor:
    """Features (N, F) of images, computed under ``torch.no_grad`` in batches, returned float32 on CPU.

    ``images`` is either one tensor (N, C, H, W), split into batches of ``batch_size``, or an iterable
    of batches (tensors, ``(images, labels)`` pairs or dicts, e.g. a DataLoader), used as given.
    Batches are moved to the extractor's device when it is a module or a bound method of one.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = images.split(batch_size) if isinstance(images, Tensor) else (extract_images(b) for b in images)
    device = _extractor_device(extractor)
    outputs = []
    with torch.no_grad():
        for batch in batches:
            if device is not None:
                batch = batch.to(device)
            feats = extractor(batch)
            if feats.ndim != 2 or feats.shape[0] != batch.shape[0]:
                raise ValueError(f"feature extractor must return (N, F) for a batch of N={batch.shape[0]}, "
                                 f"got {tuple(feats.shape)}")
            outputs.append(feats.float().cpu())
    if not outputs:
        raise ValueError("no images to compute features of")
    return torch.cat(outputs)
