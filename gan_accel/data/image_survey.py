"""Before a resolution is chosen: the sizes of a source's readable images, from the scan the cache keeps.

    sizes = image_sizes("photos/")            # [(width, height), ...] of every readable image
    side = median_short_side(sizes)            # what ``gan-accel train`` picks its default resolution from

The scan (headers only, nothing decoded) is the one :func:`~gan_accel.data.open_image_data` makes and
caches: opening the data afterwards reads it back instead of scanning again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .image_cache import CacheFolder, default_cache_root, scan_key
from .images import cached_scan, listed_source


def image_sizes(source: str | os.PathLike | Any, *, split: str | None = None, image_column: str | None = None,
                label_column: str | None = None, labels: str = "auto", cache_dir: str | os.PathLike | None = None,
                accelerator: Any = None) -> list[tuple[int, int]]:
    """(width, height) of every readable image of ``source`` (the sources of :func:`open_image_data`).

    Pass the ``label_column`` and ``labels`` that the data will be opened with: a Hugging Face
    dataset's cache key names its columns, so the scan is then shared.

    Raises :class:`DataError` for a missing or empty source, as :func:`open_image_data` does; a source
    with no readable image gives ``[]`` (opening it then says why, in one line).
    """
    src, entries = listed_source(source, split, image_column, label_column, labels, accelerator)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    scan = cached_scan(src, entries, CacheFolder(root, scan_key(src.identity(), entries)))
    return [(int(item[1]), int(item[2])) for item in scan["items"]]


def median_short_side(sizes: list[tuple[int, int]]) -> int | None:
    """The median of the images' short sides (the lower middle one for an even count); None without images."""
    if not sizes:
        return None
    sides = sorted(min(w, h) for w, h in sizes)
    return sides[(len(sides) - 1) // 2]
