"""Real images' features, computed once per dataset, resolution and feature space, and kept on disk under
``cache_dir()/features`` as safetensors, named by the data's fingerprint (files, resolution, channels, crop), the
feature space and the number of images. A file that cannot be read is computed again and replaced.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from torch import Tensor

from ..state.files import atomic_path

KEY = "features"


def cache_dir() -> Path:
    """The evaluation cache: ``$GAN_ACCEL_CACHE``, else ``$XDG_CACHE_HOME/gan_accel`` or ``~/.cache/gan_accel``."""
    if os.environ.get("GAN_ACCEL_CACHE"):
        return Path(os.environ["GAN_ACCEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gan_accel"


def cached_features(fingerprint: str, space: str, count: int, compute: Callable[[], Tensor],
                    root: str | os.PathLike | None = None) -> tuple[Tensor, bool]:
    """The features ``compute()`` returns, from the cache when they are there; (features, from_cache)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save

    folder = Path(root) if root is not None else cache_dir() / "features"
    safe_space = "".join(c if c.isalnum() or c in "-_." else "_" for c in space)
    path = folder / f"{fingerprint}-{safe_space}-{count}.safetensors"
    if path.is_file():
        try:
            features = load_file(str(path))[KEY]
            if features.ndim == 2 and len(features) == count:
                return features, True
        except (SafetensorError, OSError, KeyError, ValueError):
            pass  # damaged or foreign: computed again below
    features = compute().float().contiguous()
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(save({KEY: features}, metadata={"space": space, "fingerprint": fingerprint}))
    except OSError:
        pass  # a read-only cache costs time, not correctness
    return features, False
