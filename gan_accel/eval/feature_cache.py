"""Real images' features, computed once per dataset, resolution and feature space, and kept on disk under
``cache_dir()/features`` as safetensors, named by the data's fingerprint (files, resolution, channels, crop), the
feature space and the number of images. Nothing in it is trusted: the file records the fingerprint, the space and a
SHA-256 of the features' bytes, checked on every read; a file that cannot be read or does not match is named in one
line, computed again and replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..storage.files import atomic_path

KEY = "features"


def cache_dir() -> Path:
    """The evaluation cache: ``$GAN_ACCEL_CACHE``, else ``$XDG_CACHE_HOME/gan_accel`` or ``~/.cache/gan_accel``."""
    from ..data.image_cache import default_cache_root

    return default_cache_root().parent  # the image caches live in its images/ folder


def _sha256(features: Tensor) -> str:
    return hashlib.sha256(features.contiguous().numpy().tobytes()).hexdigest()


def _read(path: Path, fingerprint: str, space: str, count: int) -> tuple[Tensor | None, str]:
    """The cached features, or None and why they cannot be used."""
    from safetensors import SafetensorError

    from ..storage.reading import open_safetensors

    try:
        with open_safetensors(path) as handle:  # a regular file of sane size before safetensors maps it
            meta: dict[str, Any] = handle.metadata() or {}
            features = handle.get_tensor(KEY)
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as error:  # UnsafeFileError too
        return None, f"it cannot be read: {str(error).strip().splitlines()[0] if str(error).strip() else error!r}"
    if meta.get("fingerprint") != fingerprint or meta.get("space") != space:
        return None, "it was computed from other data or in another feature space"
    if features.dtype != torch.float32 or features.ndim != 2 or len(features) != count:
        return None, f"it holds {features.dtype} {tuple(features.shape)}, not {count} feature vectors"
    if meta.get("sha256") != _sha256(features):
        return None, "its features do not match the checksum recorded when it was written"
    return features, ""


def cached_features(fingerprint: str, space: str, count: int, compute: Callable[[], Tensor],
                    root: str | os.PathLike | None = None,
                    log: Callable[[str], Any] | None = print) -> tuple[Tensor, bool]:
    """The features ``compute()`` returns, from the cache when they are there and verified; (features, from_cache).
    A cache file that does not verify is one warning line to ``log``, then computed again."""
    from safetensors.torch import save

    folder = Path(root) if root is not None else cache_dir() / "features"
    safe_space = "".join(c if c.isalnum() or c in "-_." else "_" for c in space)
    path = folder / f"{fingerprint}-{safe_space}-{count}.safetensors"
    if os.path.lexists(path):
        features, why = _read(path, fingerprint, space, count)
        if features is not None:
            return features, True
        if log is not None:
            log(f"gan_accel: warning: the feature cache {path} cannot be used ({why}); computing the real features "
                "again")
    features = compute().float().contiguous().cpu()
    with contextlib.suppress(OSError):  # a read-only cache costs time, not correctness
        from ..data.image_cache import clear_stale_temporaries

        clear_stale_temporaries(folder)
        with atomic_path(path) as tmp:
            meta = {"space": space, "fingerprint": fingerprint, "sha256": _sha256(features)}
            tmp.write_bytes(save({KEY: features}, metadata=meta))
    return features, False
