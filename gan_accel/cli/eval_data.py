"""``gan-accel eval RUN --data PATH``: score a generator against the user's own images.

The samples and up to :data:`~gan_accel.cli.train_eval.REFERENCE_IMAGES` real images (a fixed,
seeded choice, centre crops at G's resolution and channels) go through one feature space: Inception-v3
(FID) when torch-fidelity and its weights are here, else the fixed random network of
:mod:`gan_accel.eval.random_features` (said in one line; its numbers compare runs on the same data
with each other, they are not FIDs). The real features are cached per dataset, resolution and feature
space (:mod:`gan_accel.eval.feature_cache`), so a second evaluation against the same folder only
samples and scores. Samples and real images are processed a chunk at a time: memory stays that of
one chunk of images plus the features.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..data import open_image_data, uint8_to_float
from ..eval import compute_features, score_features
from ..eval.feature_cache import cached_features
from ..sampling import classes_of, iter_samples
from .train_eval import REFERENCE_IMAGES, INCEPTION_NAME, choose_extractor, real_images


class _OnDevice(nn.Module):
    """G on ``device`` behind the CPU latents :func:`iter_samples` draws (the same numbers on any device)."""

    def __init__(self, G: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.G, self.device, self.z_dim, self.num_classes = G.to(device), device, G.z_dim, classes_of(G)

    def forward(self, z: torch.Tensor, *labels: torch.Tensor) -> torch.Tensor:
        return self.G(z.to(self.device), *(y.to(self.device) for y in labels))


def evaluate_on_data(G: nn.Module, source: str, num: int, features: str = "auto",
                     seed: int = 0, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Scores of ``num`` samples of G against the images of ``source`` (a folder, ZIP or ``hf:`` name)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with torch.no_grad():
        shape = G(torch.zeros(1, G.z_dim), *([torch.zeros(1, dtype=torch.long)] if classes_of(G) is not None else [])).shape
    channels, resolution = int(shape[1]), int(shape[-1])
    data = open_image_data(source, resolution=resolution, channels=channels, labels="none", log=log)
    extractor, _, space = choose_extractor(features, device, log)
    count = min(len(data), REFERENCE_IMAGES)

    def real_features() -> torch.Tensor:
        return compute_features(extractor, (uint8_to_float(part) for part in real_images(data, count).split(250)))

    real, reused = cached_features(data.fingerprint, space, count, real_features)
    sampler = _OnDevice(G, device)
    fake = compute_features(extractor, (images for images, _ in iter_samples(sampler, num, seed=seed)))
    scores = score_features(fake, real, kid_subset_size=min(1000, len(fake), len(real)), seed=0)
    fd_name = "FID" if space == INCEPTION_NAME else "Frechet distance"
    summary = "\n".join([
        f"evaluation against {source} ({len(fake)} samples vs {len(real)} real images at {resolution} px, in "
        f"{space} features{'; real features from the cache' if reused else ''})",
        f"  {fd_name}: {scores['fd']:.3f}",
        f"  KID: {scores['kid'] * 1000:.3f} +- {scores['kid_std'] * 1000:.3f} (x 1e-3)",
        f"  precision {scores['precision']:.3f}, recall {scores['recall']:.3f} (k-NN manifolds, k = 3)",
    ])
    return {"summary": summary, "data": source, "features": space, "samples": len(fake), "real_images": len(real),
            "resolution": resolution, **{k: float(v) for k, v in scores.items()}}
