"""A feature space for any images that needs no download: a fixed, randomly initialised convolutional network.

    extractor = RandomConvFeatures()                    # the same weights on every machine and every run
    reference = compute_features(extractor, real_images)
    Evaluator(extractor, reference, every=1000)

What it is: four stride-2 convolutions (3 -> 32 -> 64 -> 128 -> 256 channels, 4x4 kernels, LeakyReLU 0.2),
weights drawn once from :data:`SEED` with torch's CPU generator (He-normal scale, zero biases), on images
resized to 64x64 (bilinear, antialiased; grayscale repeated to RGB). A sample's features are the per-channel
mean and standard deviation of the last two layers' activations (2 x 128 + 2 x 256 = 768 numbers): colour,
texture and local structure at two scales, with no knowledge of any labelled data set.

What it sees, measured on 1,200 RGB digits of ``benchmarks/make_rgb_digits.py`` at 32 px (600 against
600; each distance divided by that of the two real halves): a 1.5-px blur 2.0x, swapped colour channels
1.9x, a 4-px shift 1.7x, 8-px patches shuffled 2.5x, half the set duplicated (mode collapse) 1.8x, uniform
noise 49x; a 0.7-px blur (1.06x) and +-0.1 pixel noise (0.98x) it does not see. tests/test_train_cli_data.py
checks the blur, the duplication and the noise on the offline digits.

What it is not: an FID. Never trained, it does not know what an object is; its distances compare only runs
scored with this extractor (:data:`NAME`) on the same data and resolution. For a number others can compare
with, use Inception features (:func:`~gan_accel.eval.inception_extractor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NAME = "random-conv-v1"  # recorded with the scores: change it whenever the network or its weights change
SEED = 0
SIZE = 64
WIDTHS = (32, 64, 128, 256)
SLOPE = 0.2


class RandomConvFeatures(nn.Module):
    """Images (N, 1 or 3, H, W) in [-1, 1], any size -> features (N, 768), float32. See the module docstring."""

    feature_dim = 2 * (WIDTHS[-2] + WIDTHS[-1])

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(SEED)
        layers, c_in = [], 3
        for c_out in WIDTHS:
            conv = nn.Conv2d(c_in, c_out, 4, stride=2, padding=1)
            fan_in = c_in * 16
            std = math.sqrt(2.0 / ((1 + SLOPE ** 2) * fan_in))
            with torch.no_grad():
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator) * std)
                conv.bias.zero_()
            conv.requires_grad_(False)
            layers.append(conv)
            c_in = c_out
        self.layers = nn.ModuleList(layers)
        self.eval()

    def train(self, mode: bool = True) -> "RandomConvFeatures":
        return super().train(False)  # nothing to train; one function in every mode

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        if images.ndim != 4 or images.shape[1] not in (1, 3):
            raise ValueError(f"random features need images (N, 1 or 3, H, W), got shape {tuple(images.shape)}")
        device = self.layers[0].weight.device
        x = images.detach().to(device=device, dtype=torch.float32).clamp(-1, 1)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-2:] != (SIZE, SIZE):
            x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False, antialias=True)
        pooled = []
        for index, conv in enumerate(self.layers):
            x = F.leaky_relu(conv(x), SLOPE)
            if index >= len(self.layers) - 2:
                flat = x.flatten(2)
                pooled += [flat.mean(-1), flat.std(-1)]
        return torch.cat(pooled, dim=1)


INCEPTION_NAME = "inception-v3-2048"


def choose_features(choice: str, device: Any, log: Callable[[str], Any]) -> tuple[nn.Module, Any, str]:
    """(features, logits or None, the feature space's name) for ``choice``: "inception" (torch-fidelity's
    Inception-v3, its weights downloaded once if they are not here; it must load), "random"
    (:class:`RandomConvFeatures`), or "auto" (Inception when torch-fidelity is installed and its weights are
    here or can be downloaded, else the random network, said in one line with the reason)."""
    from .inception import InceptionUnavailable, inception_extractor

    if choice in ("auto", "inception"):
        try:
            net = inception_extractor(device=device)
            return net, net.logits, INCEPTION_NAME
        except InceptionUnavailable as error:
            if choice == "inception":
                raise
            log(f"gan_accel: evaluation in the features of a fixed random network ({NAME}), not Inception "
                f"({error}); its scores compare runs on this data with each other, they are not FIDs")
    return RandomConvFeatures().to(device), None, NAME
