"""Inception-v3 features for the standard FID / KID / Inception score, through torch-fidelity (the optional
extra ``gan_accel[inception]``, imported only when :func:`inception_extractor` is called).

Comparable with published FIDs: torch-fidelity's port of the 2015 TensorFlow Inception weights, images in
[-1, 1] quantised as ``clamp(round((x + 1) * 127.5), 0, 255)`` (the exact inverse of ``uint8_to_float``),
torch-fidelity's TensorFlow-1.x resize to 299x299, float32 inside. The weights come from ``weights_path``,
``$GAN_ACCEL_INCEPTION_WEIGHTS`` or torch hub's cache, where the first use downloads them once from
:data:`WEIGHTS_URL` (:class:`~gan_accel.eval.weights.WeightsFile`: checked against their hash before they are kept).
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch
from torch import Tensor, nn

from .weights import PathLike, WeightsFile, WeightsUnavailable

WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
WEIGHTS_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{WEIGHTS_FILE}"
# The file's whole SHA-256 as users of it publish it; its first 8 digits are the ones in its name (torch hub's rule).
WEIGHTS_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"
WEIGHTS_ENV = "GAN_ACCEL_INCEPTION_WEIGHTS"
INSTALL_HINT = "pip install 'gan_accel[inception]'"
FEATURE_LAYERS = ("64", "192", "768", "2048")
# torch-fidelity's name for fc(pool) without the bias: what the original Inception-score code used.
LOGITS_LAYER = "logits_unbiased"

# (weights file, feature names) -> module taking uint8 (N, 3, H, W), returning a tuple in that order.
BackendFactory = Callable[[str, list[str]], nn.Module]


class InceptionUnavailable(WeightsUnavailable):
    """Inception features cannot be computed here: torch-fidelity or the weights file is missing."""


WEIGHTS = WeightsFile("Inception", WEIGHTS_FILE, WEIGHTS_URL, WEIGHTS_SHA256, WEIGHTS_ENV, "about 91 MB",
                      InceptionUnavailable)


def _inception_class() -> type:
    """torch-fidelity's ``FeatureExtractorInceptionV3``, imported now (never at gan_accel's import)."""
    try:
        module = importlib.import_module("torch_fidelity.feature_extractor_inceptionv3")
    except ImportError as exc:
        raise InceptionUnavailable(
            f"Inception features need torch-fidelity, which cannot be imported ({exc}); install it: {INSTALL_HINT}"
        ) from None
    return module.FeatureExtractorInceptionV3


def _torch_fidelity_backend(weights: str, features_list: list[str]) -> nn.Module:
    """torch-fidelity's Inception-v3 from a local file; checked first with ``weights_only=True``, since
    torch-fidelity's plain ``torch.load`` unpickles anything before torch 2.6."""
    from ..errors import UnsafeFileError
    from ..storage.pickles import load_pickle

    try:
        load_pickle(weights, mmap=True)
    except UnsafeFileError as error:
        raise InceptionUnavailable(f"{error} (expected torch-fidelity's {WEIGHTS_FILE})") from None
    return _inception_class()("inception-v3-compat", features_list, feature_extractor_weights_path=weights)


def to_uint8_rgb(images: Tensor, what: str = "Inception") -> Tensor:
    """Images (N, 1 or 3, H, W) in [-1, 1] -> uint8 (N, 3, H, W), clamped; NaN or inf raise (no pixel value).
    ``what`` names the features in the errors."""
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"{what} features need images (N, 1 or 3, H, W), got shape {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        raise ValueError(f"{what} extractor takes float images in [-1, 1], got uint8; convert with uint8_to_float")
    x = images.detach().float()
    if not torch.isfinite(x).all():
        raise ValueError(f"images hold NaN or inf (a diverged generator?); they have no {what} features")
    x = x.add(1).mul(127.5).round().clamp(0, 255).to(torch.uint8)
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


class InceptionExtractor(nn.Module):
    """Images (N, 1 or 3, H, W) in [-1, 1], any size -> Inception pool features (N, F), float32; ``logits(images)``
    the 1008 class logits without the fc bias (as the original Inception score). Always in eval mode."""

    def __init__(self, backend: nn.Module, feature_layer: str) -> None:
        super().__init__()
        self.net = backend
        self.feature_layer = feature_layer
        self.net.eval()

    def train(self, mode: bool = True) -> InceptionExtractor:
        super().train(mode)
        self.net.eval()  # batch-norm statistics must stay the ported ones
        return self

    @torch.no_grad()
    def features_and_logits(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Pool features (N, F) and class logits (N, K) of one batch, both float32."""
        param = next(self.net.parameters(), None)
        x = to_uint8_rgb(images)
        out = self.net(x if param is None else x.to(param.device))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise RuntimeError(f"Inception backend returned {type(out).__name__}, expected a (features, logits) tuple; "
                               "is torch-fidelity's version supported (>=0.3)?")
        feats, logits = out
        if feats.shape != (len(x), int(self.feature_layer)) or logits.ndim != 2 or len(logits) != len(x):
            raise RuntimeError(f"Inception backend returned features {tuple(feats.shape)} and logits "
                               f"{tuple(logits.shape)} for N={len(x)}, expected {self.feature_layer} features "
                               "and K logits per row")
        return feats.float(), logits.float()

    def forward(self, images: Tensor) -> Tensor:
        """Pool features (N, F)."""
        return self.features_and_logits(images)[0]

    def logits(self, images: Tensor) -> Tensor:
        """Class logits (N, 1008) for the Inception score (softmax over them gives p(y|x))."""
        return self.features_and_logits(images)[1]


def inception_extractor(weights_path: PathLike | None = None, device: str | torch.device = "cpu",
                        features: str = "2048", download: bool = True, *,
                        _backend: BackendFactory | None = None) -> InceptionExtractor:
    """torch-fidelity's Inception-v3 as a :class:`~gan_accel.eval.features.FeatureExtractor`.

    Args:
        weights_path: a local copy of :data:`WEIGHTS_FILE`; default ``$GAN_ACCEL_INCEPTION_WEIGHTS``, then torch
            hub's cache (``$TORCH_HOME/hub/checkpoints``).
        device: where the network runs; batches are moved there.
        features: the pool layer, "64", "192", "768" or "2048" (FID's; the logits are computed in any case).
        download: fetch the weights into torch hub's cache when they are nowhere (about 91 MB, once).
        _backend: test seam, replaces torch-fidelity's network (see ``BackendFactory``).

    Raises InceptionUnavailable when torch-fidelity is not installed or the weights are missing (and cannot be
    downloaded) or unreadable.
    """
    features = str(features)
    if features not in FEATURE_LAYERS:
        raise ValueError(f"features must be one of {', '.join(FEATURE_LAYERS)} (pool layer widths), got {features!r}")
    if _backend is None:
        _inception_class()  # a missing library is the first thing to fix, before the weights
        _backend = _torch_fidelity_backend
    weights = WEIGHTS.resolve(weights_path, download)
    try:
        backend = _backend(str(weights), [features, LOGITS_LAYER])
    except InceptionUnavailable:
        raise
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise InceptionUnavailable(
            f"cannot load Inception weights from {weights} ({type(exc).__name__}: {reason}); "
            f"it must be torch-fidelity's {WEIGHTS_FILE}"
        ) from exc
    return InceptionExtractor(backend, features).to(device)
