"""Inception-v3 features for the standard FID / KID / Inception score, through torch-fidelity (the optional
extra ``gan_accel[inception]``, imported only when :func:`inception_extractor` is called).

Comparable with published FIDs: torch-fidelity's port of the 2015 TensorFlow Inception weights, images in
[-1, 1] quantised as ``clamp(round((x + 1) * 127.5), 0, 255)`` (the exact inverse of ``uint8_to_float``),
torch-fidelity's TensorFlow-1.x resize to 299x299, float32 inside. The weights come from ``weights_path``,
``$GAN_ACCEL_INCEPTION_WEIGHTS`` or torch hub's cache, where the first use downloads them once from
:data:`WEIGHTS_URL` (:func:`fetch_weights`: checked against the hash in their name before they are kept).
"""

from __future__ import annotations

import hashlib
import http.client
import importlib
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Union

import torch
from torch import Tensor, nn

from ..errors import GanAccelError

WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
WEIGHTS_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{WEIGHTS_FILE}"
# The file's whole SHA-256 as users of it publish it; its first 8 digits are the ones in its name (torch hub's rule).
WEIGHTS_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"
WEIGHTS_ENV = "GAN_ACCEL_INCEPTION_WEIGHTS"
INSTALL_HINT = "pip install 'gan_accel[inception]'"
FETCH_TIMEOUT = 30.0  # seconds: the longest wait for a connection or for any bytes of the download
FETCH_LIMIT = 1800.0  # seconds: the whole download (91 MB at 50 kB/s); a server that trickles ends then
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
    """torch-fidelity's Inception-v3 from a local file; checked first with ``weights_only=True``, since
    torch-fidelity's plain ``torch.load`` unpickles anything before torch 2.6."""
    from ..errors import UnsafeFileError
    from ..storage.pickles import load_pickle

    try:
        load_pickle(weights, mmap=True)
    except UnsafeFileError as error:
        raise InceptionUnavailable(f"{error} (expected torch-fidelity's {WEIGHTS_FILE})") from None
    return _inception_class()("inception-v3-compat", features_list, feature_extractor_weights_path=weights)


def resolve_weights(weights_path: PathLike | None = None, download: bool = True) -> Path:
    """The local weights file: ``weights_path``, else ``$GAN_ACCEL_INCEPTION_WEIGHTS``, else torch hub's cache,
    downloaded there first (:func:`fetch_weights`) when it is missing and ``download`` is true."""
    env = os.environ.get(WEIGHTS_ENV, "").strip()
    if weights_path is not None or env:
        path = Path(weights_path if weights_path is not None else env).expanduser()
        if not path.is_file():
            from ..storage.reading import not_regular

            given = "" if weights_path is not None else f" (from ${WEIGHTS_ENV})"
            fix = "pass weights_path=" if weights_path is not None else f"point {WEIGHTS_ENV} at"
            # something that stands there (a FIFO, a folder, a link to a device) is named as what it is
            what = f"is {not_regular(path.stat().st_mode)}" if path.exists() else "does not exist"
            raise InceptionUnavailable(f"Inception weights file {path}{given} {what}; {fix} a local copy of "
                                       f"{WEIGHTS_FILE}")
        return path
    cached = Path(torch.hub.get_dir()) / "checkpoints" / WEIGHTS_FILE  # where torch-fidelity would download it
    if os.path.lexists(cached):  # anything standing there is judged, never downloaded over
        return verify_cached(cached, WEIGHTS_SHA256)
    if not download:
        raise InceptionUnavailable(f"Inception weights {WEIGHTS_FILE} are not in {cached.parent} (downloads are off); "
                                   f"get them from {WEIGHTS_URL} and put them there, or point {WEIGHTS_ENV} at a copy")
    return fetch_weights(cached, sha256_prefix=WEIGHTS_SHA256)


_VERIFIED: set[tuple[str, int, int, int, int]] = set()  # (path, device, inode, size, mtime) hashed this process


def verify_cached(path: Path, sha256: str) -> Path:
    """``path``, a download kept in torch hub's cache, once it is a regular file whose SHA-256 is ``sha256``:
    hashed once per process (and again when the file changes); checked to be the same file on every use.
    Anything else raises :class:`InceptionUnavailable` in one line that names it as corrupt and says to delete it."""
    from ..errors import UnsafeFileError
    from ..storage.pickles import pickled_call
    from ..storage.reading import file_sha256, not_regular

    fix = (f"delete it (rm {'-r ' if path.is_dir() and not path.is_symlink() else ''}{path}) and run again to "
           f"download it again, or put a good copy from {WEIGHTS_URL} there")
    try:
        info = os.stat(path)
    except OSError as error:
        raise InceptionUnavailable(f"the cached Inception weights {path} are corrupt (a link to nothing: "
                                   f"{os.strerror(error.errno)}); {fix}") from None
    kind = not_regular(info.st_mode)
    if kind:
        raise InceptionUnavailable(f"the cached Inception weights {path} are corrupt ({kind}); {fix}")
    key = (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if key in _VERIFIED:
        return path
    try:
        digest = file_sha256(path)
    except (OSError, UnsafeFileError) as error:
        raise InceptionUnavailable(f"the cached Inception weights {path} cannot be read ({error}); {fix}") from None
    if digest != sha256:
        call = pickled_call(path)  # read without running it: only a file that names a callable could run code
        what = (f"it is not the file: it holds pickled code (GLOBAL {call}) that could run if loaded" if call
                else f"{info.st_size:,} bytes whose SHA-256 starts {digest[:8]}, not {sha256[:8]}: truncated or damaged")
        raise InceptionUnavailable(f"the cached Inception weights {path} are corrupt ({what}); {fix}")
    _VERIFIED.add(key)
    return path


def fetch_weights(dest: PathLike, url: str | None = None, sha256_prefix: str | None = None,
                  timeout: float | None = None, limit: float | None = None, progress: bool | None = None) -> Path:
    """Download ``url`` (default :data:`WEIGHTS_URL`) to ``dest`` with a progress bar, and return ``dest``.

    The bytes go to a temporary file beside ``dest``, renamed to ``dest`` only once their SHA-256 starts with
    ``sha256_prefix`` (default: torch hub's convention, the hex digits after the last ``-`` of ``dest``'s name),
    so a partial or wrong file is never kept. ``timeout`` bounds each wait for the server (default
    :data:`FETCH_TIMEOUT`), ``limit`` the whole download (:data:`FETCH_LIMIT`). The bar shows on the local main
    process only (``progress=None``). Any failure raises :class:`InceptionUnavailable` in one line naming the file,
    where to put it by hand and :data:`WEIGHTS_ENV`.
    """
    from ..storage.files import atomic_path, first_line

    dest = Path(dest)
    url = url or WEIGHTS_URL
    timeout = FETCH_TIMEOUT if timeout is None else timeout
    limit = FETCH_LIMIT if limit is None else limit
    progress = os.environ.get("LOCAL_RANK", "0") == "0" if progress is None else progress
    named = re.fullmatch(r".*-([0-9a-f]{8,})\.\w+", dest.name)
    expected = sha256_prefix or (named.group(1) if named else None)
    if not expected:
        raise ValueError(f"no sha256_prefix given and none in the name {dest.name!r} (NAME-<hex digits>.EXT)")
    # Not torch.hub.download_url_to_file: no timeout (only the process-wide socket default, which bounds other threads'
    # sockets too), blocking 128 KiB reads with no hook, so a trickle runs past any limit (51 s for 16 KiB against
    # 0.5 s), and a body cut short ends silently (http.client), read as a wrong hash, not "500 of 1000 bytes".
    started = time.monotonic()
    try:
        _clear_stale_downloads(dest, 3 * timeout)
        with urllib.request.urlopen(url, timeout=timeout) as response, atomic_path(dest) as tmp:
            if progress:
                print(f"gan_accel: first use of Inception features: downloading {dest.name} (about 91 MB, once) "
                      f"into {dest.parent}", file=sys.stderr, flush=True)
            total = int(response.headers.get("Content-Length") or 0) or None
            digest, received = hashlib.sha256(), 0
            with open(tmp, "wb") as out, _bar(total, dest.name, progress) as bar:
                while chunk := response.read1(1 << 20):  # what has arrived: a trickle still meets the limit
                    if time.monotonic() - started > limit:
                        raise TimeoutError(f"the download took longer than {limit:g} s")
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            if total is not None and received != total:
                raise ConnectionError(f"the connection closed after {received} of {total} bytes")
            if not digest.hexdigest().startswith(expected):
                raise ValueError(f"the file's SHA-256 starts {digest.hexdigest()[:len(expected)]}, not {expected} as "
                                 "its name says: refused")
    except (OSError, http.client.HTTPException, ValueError) as error:
        reason = getattr(error, "reason", None) if isinstance(error, urllib.error.URLError) else error
        if isinstance(error, urllib.error.HTTPError):
            reason = f"HTTP {error.code} {error.reason}"
        elif isinstance(reason, TimeoutError) and str(reason) in ("", "timed out"):  # the socket's own words
            reason = f"no answer within {timeout:g} s"
        elif isinstance(reason, socket.gaierror):
            reason = f"cannot look up {urllib.parse.urlsplit(url).hostname}: {reason.strerror}; is this machine offline?"
        reason = " ".join(first_line(reason).split()) if isinstance(reason, BaseException) else str(reason)
        raise InceptionUnavailable(
            f"cannot download the Inception weights {dest.name} from {url} ({reason}); download that file by hand "
            f"and put it in {dest.parent}, or point {WEIGHTS_ENV} at your copy") from None
    return dest


def _bar(total: int | None, name: str, show: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="B", unit_scale=True, unit_divisor=1024, disable=not show,
                file=sys.stderr, dynamic_ncols=True)


def _clear_stale_downloads(dest: Path, age: float) -> None:
    """Remove what a killed download left beside ``dest``: a live download writes at least every ``timeout``."""
    for stale in dest.parent.glob(f".{dest.name}.*.tmp"):
        try:
            if time.time() - stale.stat().st_mtime > age:
                stale.unlink()
        except OSError:
            pass  # gone already, or not ours to remove: it is never read


def to_uint8_rgb(images: Tensor) -> Tensor:
    """Images (N, 1 or 3, H, W) in [-1, 1] -> uint8 (N, 3, H, W), clamped; NaN or inf raise (no pixel value)."""
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
    weights = resolve_weights(weights_path, download)
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
