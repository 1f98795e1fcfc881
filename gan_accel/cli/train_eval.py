"""Evaluation during ``gan-accel train`` (``--eval-every``): a feature space that works on any images here.

* ``--eval-features inception``: torch-fidelity's Inception-v3 (the FID's features), which needs
  ``pip install 'gan_accel[inception]'`` and its weights on this machine (nothing is downloaded);
* ``--eval-features random``: :mod:`gan_accel.eval.random_features`, a fixed randomly initialised
  network: no download, any images, comparable only between runs scored with it;
* ``auto`` (the default): Inception when it can be loaded, else the random network, said in one line.

The real features are computed once, when the run starts, from up to :data:`REFERENCE_IMAGES` images of
the data (a fixed, seeded choice, centre-cropped and without flips: the data as it is).
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import numpy as np
import torch

from ..callbacks import Evaluator
from ..data import ImageData, uint8_to_float
from ..data.image_decode import decode_bytes_or_path
from ..eval import InceptionUnavailable, compute_features, inception_extractor
from ..eval.random_features import NAME as RANDOM_NAME
from ..eval.random_features import random_conv_extractor

REFERENCE_IMAGES = 10_000
INCEPTION_NAME = "inception-v3-2048"


def choose_extractor(choice: str, device: Any, log: Callable[[str], Any]) -> tuple[Any, Any, str]:
    """(features, logits or None, the feature space's name) for ``--eval-features``."""
    if choice in ("auto", "inception"):
        try:
            net = inception_extractor(device=device)
            return net, net.logits, INCEPTION_NAME
        except InceptionUnavailable as error:
            if choice == "inception":
                raise
            log(f"gan_accel: evaluation in the features of a fixed random network ({RANDOM_NAME}), not Inception "
                f"({error}); its scores compare runs on this data with each other, they are not FIDs")
    return random_conv_extractor(device), None, RANDOM_NAME


def reference_rows(count: int, total: int, seed: int) -> np.ndarray:
    """Which images the real features come from: ``count`` of ``total``, chosen by ``seed``, in order."""
    chosen = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:count]
    return np.sort(chosen.numpy())


def real_images(data: ImageData, count: int, seed: int = 0) -> torch.Tensor:
    """``count`` images of the data as uint8 (N, C, R, R): centre crops, no flips, the same on every process."""
    rows = reference_rows(min(count, len(data)), len(data), seed)
    if data.cached and data.crop == "center":  # the memory-mapped cache holds exactly these crops
        array = np.load(data.cache.images(data.prep), mmap_mode="r", allow_pickle=False)
        return torch.from_numpy(np.ascontiguousarray(array[rows]))
    decoded = []
    for row in rows:
        try:
            decoded.append(decode_bytes_or_path(data.source.open(data.names[int(row)]), data.resolution, data.channels,
                                                "center", data.background))
        except Exception:  # a file that turned bad after the scan: training skips it too
            continue
    return torch.from_numpy(np.stack(decoded))


def build_evaluator(args: argparse.Namespace, data: ImageData, accelerator: Any,
                    log: Callable[[str], Any]) -> tuple[Evaluator, str]:
    """The :class:`~gan_accel.callbacks.Evaluator` of ``--eval-every``, and the name of its feature space."""
    features, logits, name = choose_extractor(args.eval_features, accelerator.device, log)
    real = real_images(data, REFERENCE_IMAGES, seed=args.seed)
    # a chunk at a time in float: 10,000 images at 256 px would be 7.9 GB as one float tensor
    reference = compute_features(features, (uint8_to_float(part) for part in real.split(250)))
    log(f"gan_accel: evaluation every {args.eval_every} steps: {args.eval_samples} samples against {len(real)} real "
        f"images in {name} features")
    evaluator = Evaluator(features, reference, every=args.eval_every, num_samples=args.eval_samples, metric="fd",
                          logits=logits, seed=1234)
    return evaluator, name
