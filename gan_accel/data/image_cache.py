"""The on-disk cache of a scanned and decoded image set: JSON for what was found, ``.npy`` for the pixels.

Layout, under the cache root (``cache_dir``, else ``$GAN_ACCEL_CACHE/images``, else
``$XDG_CACHE_HOME/gan_accel/images``, else ``~/.cache/gan_accel/images``)::

    <key>/scan.json                          the scan: readable images (header size and mode), skipped files
    <key>/64px-3ch-center-white.json         this preprocessing: cached or not, and what failed to decode
    <key>/64px-3ch-center-white.skipped.txt  every file skipped (scan and decode), one "name<TAB>reason" a line
    <key>/64px-3ch-center-white.npy          uint8 (N, C, R, R); (N, C, R, 1.5R) strips for crop="random"
    <key>/64px-3ch-random-white.strips.npy   int16 (N, 2): each strip's length and whether it was portrait

``<key>`` hashes the source and every candidate's name, size and change stamp: a changed folder gets a new
key. Every file is written to a temporary name and renamed into place, the JSON last: a reader never sees
half a cache. Nothing here is unpickled: ``np.load(allow_pickle=False)`` and JSON only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import DataError
from ..state.files import atomic_path, temporary_name, write_bytes_synced
from . import image_decode
from .image_decode import Preprocessing
from .image_scan import scan, skip_reason
from .image_sources import Entry, ImageSource

CACHE_VERSION = 1  # part of every key: a change to decoding or to the layout invalidates old caches


def default_cache_root() -> Path:
    """Where image caches go when ``cache_dir`` is not given (see the module docstring)."""
    if os.environ.get("GAN_ACCEL_CACHE"):
        return Path(os.environ["GAN_ACCEL_CACHE"]) / "images"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gan_accel" / "images"


def scan_key(identity: dict[str, Any], entries: Sequence[Any]) -> str:
    """A hex digest of the source and its listing (names, sizes, change stamps)."""
    digest = hashlib.sha256(json.dumps({"version": CACHE_VERSION, "source": identity}, sort_keys=True).encode())
    for entry in entries:
        digest.update(f"{entry.name}\0{entry.size}\0{entry.stamp}\n".encode())
    return digest.hexdigest()


def within_budget(prep: Preprocessing, count: int, budget: int | None) -> tuple[bool, str]:
    """Whether ``count`` images decoded with ``prep`` fit the memory budget (None: a quarter of the machine's
    physical memory, 4 GiB where it cannot be read), and why not."""
    if budget is None:
        try:
            budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
        except (ValueError, OSError, AttributeError):
            budget = 4 << 30
    size = prep.bytes_for(count)
    if budget <= 0:
        return False, "caching is off: memory_budget=0"
    if size > budget:
        return False, f"{size / 1e9:,.2f} GB decoded is more than the memory budget of {budget / 1e9:,.2f} GB"
    return True, ""


def cache_error(error: OSError, root: Path) -> DataError:
    """One line for a cache that cannot be written."""
    reason = f"{os.strerror(error.errno)}" if error.errno else (str(error) or type(error).__name__)
    return DataError(f"cannot write the image cache at {error.filename or root}: {reason}; choose another place "
                     "with cache_dir (or $GAN_ACCEL_CACHE)")


class CacheFolder:
    """The files of one key (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, key: str) -> None:
        self.root = Path(root)
        self.path = self.root / key[:32]

    @property
    def scan_json(self) -> Path:
        return self.path / "scan.json"

    def file(self, prep: Preprocessing, suffix: str) -> Path:
        """One of ``prep``'s files: ``.npy``, ``.strips.npy``, ``.json`` or ``.skipped.txt``."""
        return self.path / f"{prep.name}{suffix}"

    def read_json(self, path: Path) -> dict[str, Any] | None:
        """The JSON at ``path``, or None when it is missing or unreadable (then it is rebuilt)."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("version") == CACHE_VERSION else None

    def write_json(self, path: Path, data: dict[str, Any]) -> None:
        write_bytes_synced(path, json.dumps({"version": CACHE_VERSION, **data}).encode())

    def has_images(self, prep: Preprocessing, rows: int) -> bool:
        """Whether the cached array is there, uint8 and of ``rows`` rows (memory-mapped to look: nothing read)."""
        try:
            images = np.load(self.file(prep, ".npy"), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):
            return False
        return images.dtype == np.uint8 and images.ndim == 4 and images.shape[0] == rows

    def scan(self, source: ImageSource, entries: list[Entry]) -> dict[str, Any]:
        """The scan of ``entries`` (:func:`~gan_accel.data.image_scan.scan`), read from the cache or made and cached:
        ``{"source", "items": [(entry index, width, height, mode, grey), ...], "skipped": [[name, reason], ...]}``."""
        scan_data = self.read_json(self.scan_json)
        if scan_data is None:
            items, skipped = scan(source, entries)
            scan_data = {"source": source.description, "items": items, "skipped": [[s.name, s.reason] for s in skipped]}
            self.write_json(self.scan_json, scan_data)
        return scan_data


class _DecodeJob(Dataset):
    """One decode per index, for the cache build (in DataLoader workers when there are many images)."""

    def __init__(self, source: ImageSource, names: Sequence[str], prep: Preprocessing) -> None:
        self.source, self.names, self.prep = source, names, prep

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None, str]:
        try:
            return index, image_decode.decode_image(self.source.open(self.names[index]), self.prep), ""
        except MemoryError:
            raise
        except Exception as error:  # Pillow raises many types for corrupt data; any of them means "skip this file"
            return index, None, skip_reason(error)


def _single_thread(_: int) -> None:
    torch.set_num_threads(1)  # decoding workers need no intra-op threads of their own


def build_images(folder: CacheFolder, prep: Preprocessing, source: ImageSource, names: Sequence[str], workers: int,
                 progress: Callable[[int], Any] | None = None) -> list[tuple[str, str]]:
    """Decode ``names`` into ``<prep>.npy`` (and ``.strips.npy``); returns the (name, reason) of failures.

    Written to a temporary file and renamed: a build cut short leaves no cache behind. With
    ``workers > 0`` the decoding runs in that many DataLoader worker processes.
    """
    n = len(names)
    final = folder.file(prep, ".npy")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(final)
    failed: list[tuple[str, str]] = []
    try:
        shape = (n, prep.channels, prep.resolution, prep.width)
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        # the random crop needs each strip's real length (the rest is padding) and orientation
        strips = np.zeros((n, 2), dtype=np.int16)
        job = _DecodeJob(source, names, prep)
        if workers > 0:
            results: Any = (item for batch in DataLoader(job, batch_size=32, num_workers=workers, collate_fn=list,
                                                         worker_init_fn=_single_thread) for item in batch)
        else:
            results = (job[i] for i in range(n))
        for index, decoded, reason in results:  # in order: the images decoded fill the first rows
            if decoded is None:
                failed.append((names[index], reason))
            else:
                portrait = decoded.shape[1] > decoded.shape[2]
                if portrait:  # stored with the long side last; the random crop turns it back
                    decoded = decoded.transpose(0, 2, 1)
                row, length = index - len(failed), decoded.shape[-1]
                array[row, :, :, :length] = decoded
                strips[row] = (length, int(portrait))
            if progress is not None and (index + 1) % 4096 == 0:
                progress(index + 1)
        rows = n - len(failed)
        if failed:  # copied into a file of the right length, chunked: bounded memory
            compact = tmp.with_name(tmp.name + ".compact")
            out = np.lib.format.open_memmap(compact, mode="w+", dtype=np.uint8, shape=(rows, *shape[1:]))
            for start in range(0, rows, 4096):
                out[start:start + 4096] = array[start:min(start + 4096, rows)]
            del array
            os.replace(compact, tmp)
            array = out
        array.flush()
        del array
        if prep.crop == "random":
            with atomic_path(folder.file(prep, ".strips.npy")) as strips_tmp:
                with open(strips_tmp, "wb") as handle:
                    np.save(handle, strips[:rows], allow_pickle=False)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return failed
