"""Inception-v3 features for the standard FID / KID / Inception score, through torch-fidelity.

An optional extra (``pip install 'gan_accel[inception]'``); gan_accel imports without it, and
torch-fidelity is imported only when :func:`inception_extractor` is called.

What makes the numbers comparable with published FIDs (and with torch-fidelity / torchmetrics):

* the weights: torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth``, a port of the
  TensorFlow Inception graph of 2015-12-05 that the original FID and Inception-score code used
  (not torchvision's ImageNet Inception-v3, whose features differ);
* the input: images in [-1, 1] are quantised to uint8 as ``clamp(round((x + 1) * 127.5), 0, 255)``,
  the exact inverse of ``uint8 / 127.5 - 1`` (the project's ``uint8_to_float``), so real images
  decoded from uint8 reach the network unchanged; grayscale is repeated to 3 channels;
* the resize: torch-fidelity's own bilinear resize to 299x299 that reproduces TensorFlow 1.x's
  (not ``F.interpolate``), done inside the network on the uint8 values;
* float32 inside the network (torch-fidelity's default).

These machines cannot download the weights: give a local copy through ``weights_path`` or the
``GAN_ACCEL_INCEPTION_WEIGHTS`` environment variable, or place it in torch hub's cache
(``$TORCH_HOME/hub/checkpoints/``). On a machine with internet it is at :data:`WEIGHTS_URL`.

Distances computed on other extractors' features (e.g. the MNIST classifier of
:mod:`gan_accel.eval.mnist`) are Fréchet distances in another space: useful to compare runs with
each other, never comparable to an FID.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Callable, Union

import torch
from torch import Tensor, nn

from ..errors import GanAccelError

WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
WEIGHTS_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{WEIGHTS_FILE}"
WEIGHTS_ENV = "GAN_ACCEL_INCEPTION_WEIGHTS"
INSTALL_HINT = "pip install 'gan_accel[inception]'"
FEATURE_LAYERS = ("64", "192", "768", "2048")
# torch-fidelity's name for fc(pool) without the bias: what the original Inception-score code used.
LOGITS_LAYER = "logits_unbiased"

PathLike = Union[str, os.PathLike]
# (weights file, feature names) -> module taking uint8 (N, 3, H, W), returning a tuple in that order.
BackendFactory = Callable[[str, list[str]], nn.Module]


class InceptionUnavailable(GanAccelError, RuntimeError):
    """Inception features cannot be computed here: torch-fidelity or the weights file is missing."""


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
    """torch-fidelity's Inception-v3, loaded from a local file (a path, so it never downloads).

    torch-fidelity reads the file with a plain ``torch.load``, which unpickles anything before torch 2.6: the
    file is first checked to hold tensors and plain data only (``weights_only=True``), else refused."""
    from ..errors import UnsafeFileError
    from ..state.pickles import load_pickle

    try:
        load_pickle(weights, mmap=True)
    except UnsafeFileError as error:
        raise InceptionUnavailable(f"{error} (expected torch-fidelity's {WEIGHTS_FILE})") from None
    return _inception_class()("inception-v3-compat", features_list, feature_extractor_weights_path=weights)


def hub_cache_path() -> Path:
    """Where torch hub (and so torch-fidelity) keeps the weights: ``<torch.hub.get_dir()>/checkpoints``."""
    return Path(torch.hub.get_dir()) / "checkpoints" / WEIGHTS_FILE


def resolve_weights(weights_path: PathLike | None = None) -> Path:
    """The local weights file: ``weights_path``, else ``$GAN_ACCEL_INCEPTION_WEIGHTS``, else torch hub's cache.

    Never downloads: raises :class:`InceptionUnavailable` when none of these holds the file.
    """
    if weights_path is not None:
        path = Path(weights_path).expanduser()
        if not path.is_file():
            raise InceptionUnavailable(
                f"Inception weights file {path} does not exist; pass weights_path= a local copy of {WEIGHTS_FILE}"
            )
        return path
    env = os.environ.get(WEIGHTS_ENV, "").strip()
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise InceptionUnavailable(
                f"Inception weights file {path} (from ${WEIGHTS_ENV}) does not exist; "
                f"point {WEIGHTS_ENV} at a local copy of {WEIGHTS_FILE}"
            )
        return path
    cached = hub_cache_path()
    if cached.is_file():
        return cached
    raise InceptionUnavailable(
        f"Inception weights {WEIGHTS_FILE} are not on this machine (not in {cached.parent}) and cannot be "
        f"downloaded here; copy the file (from {WEIGHTS_URL}) and pass weights_path=... or set {WEIGHTS_ENV}=/path/to/it"
    )


def to_uint8_rgb(images: Tensor) -> Tensor:
    """Images (N, 1 or 3, H, W) in [-1, 1] -> uint8 (N, 3, H, W): ``clamp(round((x + 1) * 127.5), 0, 255)``.

    Values outside [-1, 1] are clamped; NaN or inf raise, since they have no pixel value.
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"Inception features need images (N, 1 or 3, H, W), got shape {tuple(images.shape)}")
    if images.dtype == torch.uint8:
        raise ValueError("Inception extractor takes float images in [-1, 1], got uint8; convert with uint8_to_float")
    x = images.detach().float()
    if not torch.isfinite(x).all():
        raise ValueError("images hold NaN or inf (a diverged generator?); they have no Inception features")
    x = x.add(1).mul(127.5).round().clamp(0, 255).to(torch.uint8)
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


class InceptionExtractor(nn.Module):
    """Images (N, 1 or 3, H, W) in [-1, 1], any size -> Inception pool features (N, F), float32.

    ``logits(images)`` gives the 1008-way class logits without the fc bias (torch-fidelity's
    ``logits_unbiased``), which the original Inception-score code used. ``features_and_logits``
    returns both from one pass. The network stays in eval mode, whatever ``train()`` is called with.
    """

    def __init__(self, backend: nn.Module, feature_layer: str) -> None:
        super().__init__()
        self.net = backend
        self.feature_layer = feature_layer
        self.net.eval()

    def train(self, mode: bool = True) -> InceptionExtractor:
        super().train(mode)
        self.net.eval()  # batch-norm statistics must stay the ported ones
        return self

    def _device(self) -> torch.device | None:
        param = next(self.net.parameters(), None)
        return None if param is None else param.device

    @torch.no_grad()
    def features_and_logits(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Pool features (N, F) and class logits (N, K) of one batch, both float32."""
        x = to_uint8_rgb(images)
        device = self._device()
        if device is not None:
            x = x.to(device)
        out = self.net(x)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise RuntimeError(
                f"Inception backend returned {type(out).__name__}, expected a (features, logits) tuple; "
                "is torch-fidelity's version supported (>=0.3)?"
            )
        n = images.shape[0]
        feats, logits = out
        for name, t in (("features", feats), ("logits", logits)):
            if t.ndim != 2 or t.shape[0] != n:
                raise RuntimeError(f"Inception backend returned {name} of shape {tuple(t.shape)} for N={n}, expected (N, K)")
        if feats.shape[1] != int(self.feature_layer):
            raise RuntimeError(f"Inception backend returned {feats.shape[1]} features, expected {self.feature_layer}")
        return feats.float(), logits.float()

    def forward(self, images: Tensor) -> Tensor:
        """Pool features (N, F)."""
        return self.features_and_logits(images)[0]

    def logits(self, images: Tensor) -> Tensor:
        """Class logits (N, 1008) for the Inception score (softmax over them gives p(y|x))."""
        return self.features_and_logits(images)[1]


def inception_extractor(
    weights_path: PathLike | None = None,
    device: str | torch.device = "cpu",
    features: str = "2048",
    *,
    _backend: BackendFactory | None = None,
) -> InceptionExtractor:
    """torch-fidelity's Inception-v3 as a :class:`~gan_accel.eval.features.FeatureExtractor`.

    Args:
        weights_path: a local copy of ``weights-inception-2015-12-05-6726825d.pth``; default
            ``$GAN_ACCEL_INCEPTION_WEIGHTS``, then torch hub's cache. Nothing is ever downloaded.
        device: where the network runs; batches are moved there.
        features: the pool layer, one of "64", "192", "768", "2048" (FID uses "2048"). The class
            logits are always computed too, so layers before "2048" save no time.
        _backend: test seam, replaces torch-fidelity's network (see ``BackendFactory``).

    Raises:
        InceptionUnavailable: torch-fidelity is not installed, or the weights file is missing or unreadable.
    """
    features = str(features)
    if features not in FEATURE_LAYERS:
        raise ValueError(f"features must be one of {', '.join(FEATURE_LAYERS)} (pool layer widths), got {features!r}")
    if _backend is None:
        _inception_class()  # a missing library is the first thing to fix, before the weights
        _backend = _torch_fidelity_backend
    weights = resolve_weights(weights_path)
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
