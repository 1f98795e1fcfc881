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

Nothing in the cache is trusted: each JSON records the key it belongs to and a SHA-256 of its own content, the
preprocessing's JSON also those of the arrays; anything that does not match or parse is named in one line and
built again. A build preallocates its array (a full disk is one line, not a ``Bus error``), its decoding workers
die with it, and the temporary files of a killed build (named ``.<file>.<host>.<pid>.tmp``) are removed by the
next build on the same host.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import json
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import DataError, UnsafeFileError
from ..storage.files import atomic_path, clear_dead_temporaries, remove_entry, temporary_name, write_bytes_synced
from ..storage.reading import file_sha256, load_array, read_bytes
from . import image_decode
from .image_decode import Preprocessing
from .image_scan import scan, skip_reason
from .image_sources import Entry, ImageSource

MAX_RECORD_BYTES = 1 << 30  # scan.json lists every file of the data: millions of names fit
CACHE_VERSION = 2  # part of every key: a change to decoding or to the layout invalidates old caches


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
        digest.update(f"{entry.name}\0{entry.size}\0{entry.stamp}\n".encode("utf-8", "surrogateescape"))  # names the OS gave as bytes
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
                     "with --cache-dir (cache_dir= in Python) or $GAN_ACCEL_CACHE")


def _json_sha256(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def clear_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files (``.<name>.<host>.<pid>.tmp``, and ``.compact`` ones) that a killed writer on
    this host left in ``folder``; those of live processes and other hosts are kept. Returns what was removed."""
    return clear_dead_temporaries(folder, every_name=True)


class CacheFolder:
    """The files of one key (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, key: str) -> None:
        self.root = Path(root)
        self.key = key
        self.path = self.root / key[:32]

    @property
    def scan_json(self) -> Path:
        return self.path / "scan.json"

    def file(self, prep: Preprocessing, suffix: str) -> Path:
        """One of ``prep``'s files: ``.npy``, ``.strips.npy``, ``.json`` or ``.skipped.txt``."""
        return self.path / f"{prep.name}{suffix}"

    def read_json(self, path: Path, say: Callable[[str], Any] | None = None) -> dict[str, Any] | None:
        """The JSON at ``path`` when it is this key's and matches its checksum; None when it is missing, and also
        (with one line to ``say``) when it is damaged, foreign or changed: then it is rebuilt."""
        try:
            text = read_bytes(path, MAX_RECORD_BYTES)
        except (FileNotFoundError, NotADirectoryError):  # not there (a cache folder that is a file: said on writing)
            return None
        except OSError as error:
            return self._distrust(path, os.strerror(error.errno) if error.errno else str(error), say)
        except UnsafeFileError as error:  # a FIFO, a device or a huge file: rebuilt (the write replaces it)
            return self._distrust(path, str(error), say)
        try:
            data = json.loads(text)
        except ValueError:
            return self._distrust(path, "it is not valid JSON", say)
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            return self._distrust(path, "it was written by another version of gan_accel", say)
        body = {k: v for k, v in data.items() if k != "sha256"}
        if data.get("key") != self.key or data.get("sha256") != _json_sha256(body):
            return self._distrust(path, "it does not match its checksum or its data", say)
        return data

    @staticmethod
    def _distrust(path: Path, why: str, say: Callable[[str], Any] | None) -> None:
        if say is not None:
            say(f"gan_accel: warning: the image cache file {path} cannot be used ({why}); building it again")

    def write_json(self, path: Path, data: dict[str, Any]) -> None:
        body = {"version": CACHE_VERSION, "key": self.key, **data}
        write_bytes_synced(path, json.dumps({**body, "sha256": _json_sha256(body)}).encode())

    def verified(self, prep: Preprocessing, done: dict[str, Any] | None, say: Callable[[str], Any] | None) -> bool:
        """Whether the cached arrays are there and hold what ``done`` (the preprocessing's JSON) recorded: their
        SHA-256 (every byte read), dtype and rows. A mismatch is one line to ``say``."""
        if done is None or not done.get("cached"):
            return False
        files = {".npy": done.get("images_sha256")}
        if prep.crop == "random":
            files[".strips.npy"] = done.get("strips_sha256")
        for suffix, expected in files.items():
            path = self.file(prep, suffix)
            try:
                same = file_sha256(path) == expected
                array = load_array(path, mmap=True) if same else None
            except (OSError, ValueError, UnsafeFileError) as error:
                same, why = False, f"it cannot be read: {error}"
            else:
                why = "its bytes do not match the checksum recorded when it was written"
            if same and suffix == ".npy":
                same = array.dtype == np.uint8 and array.shape == (done.get("rows"), prep.channels, prep.resolution,
                                                                   prep.width)
            if not same:
                if say is not None:
                    say(f"gan_accel: warning: the image cache {path} cannot be used ({why}); decoding the images again")
                return False
        return True

    def scan(self, source: ImageSource, entries: list[Entry], write: bool = True) -> dict[str, Any]:
        """The scan of ``entries`` (:func:`~gan_accel.data.image_scan.scan`), read from the cache or made and cached
        (``write=False``: made and not cached):
        ``{"source", "items": [(entry index, width, height, mode, grey), ...], "skipped": [[name, reason], ...]}``."""
        say = print if write else None  # a file distrusted is said where it is built again
        scan_data = self.read_json(self.scan_json, say=say)
        if scan_data is not None and not _valid_scan(scan_data, len(entries)):
            scan_data = self._distrust(self.scan_json, "its content is not a scan of this data", say)
        if scan_data is None:
            if write:
                clear_stale_temporaries(self.path)
            items, skipped = scan(source, entries)
            scan_data = {"source": source.description, "items": items, "skipped": [[s.name, s.reason] for s in skipped]}
            if write:
                self.write_json(self.scan_json, scan_data)
        return scan_data


def _valid_scan(data: dict[str, Any], count: int) -> bool:
    """Whether a scan's JSON holds what :meth:`CacheFolder.scan` writes (a checksum can be forged with its content)."""
    items, skipped = data.get("items"), data.get("skipped")
    return isinstance(items, list) and isinstance(skipped, list) and all(
        isinstance(i, list) and len(i) == 5 and all(type(v) is int for v in i[:3]) and 0 <= i[0] < count
        and i[1] > 0 and i[2] > 0 and isinstance(i[3], str) and isinstance(i[4], bool) for i in items) and all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(v, str) for v in s) for s in skipped)


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


def die_with_parent(_: int = 0, parent: int | None = None) -> None:
    """A DataLoader ``worker_init_fn``: the worker is killed when the process that started it dies (Linux), and
    uses one intra-op thread. Without it a worker whose parent was killed stays blocked writing to their pipe."""
    torch.set_num_threads(1)  # decoding workers need no intra-op threads of their own
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: torch's own watchdog is what is left
        return
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # the parent died before the line above


def preallocate(path: Path) -> None:
    """Reserve a sparse file's blocks: a memory-mapped write into a full disk is a ``Bus error``, this an
    ``OSError`` (ENOSPC) that becomes one line."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # a file system without it
            raise
    except AttributeError:  # no posix_fallocate (macOS): the free-space check before the build is what is left
        pass
    finally:
        os.close(fd)


def fresh_temporaries(final: Path) -> tuple[Path, Path]:
    """The build's two temporary names beside ``final`` (the array, its compacted copy), each free: this process
    id's leftovers, or links someone left there, are removed as names, never written through."""
    tmp = temporary_name(final)
    compact = tmp.with_name(tmp.name + ".compact")
    for leftover in (tmp, compact):
        remove_entry(leftover)
    return tmp, compact


def build_images(folder: CacheFolder, prep: Preprocessing, source: ImageSource, names: Sequence[str], workers: int,
                 progress: Callable[[int], Any] | None = None) -> list[tuple[str, str]]:
    """Decode ``names`` into ``<prep>.npy`` (and ``.strips.npy``); returns the (name, reason) of failures.

    Written to a temporary file and renamed: a build cut short leaves no cache behind (and one killed leaves a
    file the next build removes). With ``workers > 0`` the decoding runs in that many DataLoader worker
    processes, which die with this one.
    """
    n = len(names)
    final = folder.file(prep, ".npy")
    final.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_temporaries(final.parent)
    tmp, compact = fresh_temporaries(final)
    failed: list[tuple[str, str]] = []
    try:
        shape = (n, prep.channels, prep.resolution, prep.width)
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        preallocate(tmp)
        # the random crop needs each strip's real length (the rest is padding) and orientation
        strips = np.zeros((n, 2), dtype=np.int16)
        jobs = DataLoader(_DecodeJob(source, names, prep), batch_size=32, num_workers=workers, collate_fn=list,
                          worker_init_fn=functools.partial(die_with_parent, parent=os.getpid()) if workers else None)
        for index, decoded, reason in itertools.chain.from_iterable(jobs):  # in order: the decoded fill the first rows
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
            out = np.lib.format.open_memmap(compact, mode="w+", dtype=np.uint8, shape=(rows, *shape[1:]))
            preallocate(compact)
            for start in range(0, rows, 4096):
                out[start:start + 4096] = array[start:min(start + 4096, rows)]
            del array
            os.replace(compact, tmp)
            array = out
        array.flush()
        del array
        if prep.crop == "random":
            with atomic_path(folder.file(prep, ".strips.npy")) as strips_tmp, open(strips_tmp, "wb") as handle:
                np.save(handle, strips[:rows], allow_pickle=False)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
        compact.unlink(missing_ok=True)
    return failed
