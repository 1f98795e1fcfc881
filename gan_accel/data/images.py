"""Train on your own images: a folder, a ZIP or a Hugging Face dataset, scanned once, decoded once.

    data = open_image_data("photos/", resolution=64)      # scan, check, cache (or not), report
    loader = data.dataloader(batch_size=64, random_flip=True)
    # batches: float32 (B, C, R, R) in [-1, 1], and int64 labels when the data has classes

The steps, in :func:`open_image_data`:

1. **List** the source (names, sizes, modification times; nothing opened) and hash the listing with the
   source into the cache key (:mod:`gan_accel.data.image_cache`).
2. **Scan** every candidate's header (:mod:`gan_accel.data.image_scan`): files that are not images,
   unreadable or truncated are skipped, listed, and named in one warning line. Everything the user can
   fix (no readable image, no labels for ``labels="required"``, fewer images than a batch, ...) is one
   :class:`~gan_accel.errors.DataError` line, before any pixel is decoded.
3. **Decode once**: a set whose uint8 array fits ``memory_budget`` (default: a quarter of the
   machine's memory) is decoded into ``<cache>/<key>/<R>px-<C>ch-<crop>-<background>.npy``, then every
   process memory-maps that file: one copy in the page cache, shared by all processes, and a batch is
   one gather. A larger set (or no room on disk for the cache) is decoded per item in DataLoader
   workers instead; a file that turns bad after the scan is then skipped, counted
   (:attr:`ImageData.failed_during_training`) and replaced by the next readable item, so a batch keeps
   its size and training goes on.

Under ``accelerate launch``, pass ``accelerator``: the first process on each machine scans and builds
while the others wait, then every process reads the same files; an error on the builder is raised by
every process (no process is left waiting).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, get_worker_info

from ..errors import DataError, GanAccelError
from ..state.layout import CLASS_NAMES, DATA_RECORD, SKIPPED_FILES
from . import image_cache, image_decode
from .image_cache import (CacheFolder, build_images, default_cache_root, prep_name, scan_key, strip_width,
                          write_text_atomic)
from .image_decode import BACKGROUNDS, CROPS, mode_family
from .image_scan import ScanReport, SkippedFile, scan, size_summary, skip_reason
from .image_sources import FolderSource, HFSource, ImageSource, ZipSource, folder_classes, load_hf, pick_split

LABEL_MODES = ("auto", "none", "required")
MIN_RESOLUTION, MAX_RESOLUTION = 8, 4096
_REPLACEMENT_TRIES = 16  # consecutive unreadable items before the per-item path gives up
_FAILURES_LOGGED = 5  # per process: the first few files that turned bad are named on stderr


def default_memory_budget() -> int:
    """A quarter of the machine's physical memory (4 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _rng(private: torch.Generator) -> torch.Generator | None:
    """The generator for augmentation: the worker's own (seeded per worker by the DataLoader) inside a
    DataLoader worker, else ``private``. Never the main process's global generator: drawing from it would
    shift the training noise."""
    return None if get_worker_info() is not None else private


def random_window(images: Tensor, lengths: Tensor, portrait: Tensor, resolution: int,
                  generator: torch.Generator | None) -> Tensor:
    """R x R windows at random offsets of uint8 strips (B, C, R, W) whose first ``lengths`` columns are real;
    strips stored transposed (``portrait``) are turned back."""
    b, c = images.shape[:2]
    room = (lengths.to(torch.float64) - resolution + 1).clamp_min(1)
    offsets = (torch.rand(b, generator=generator, dtype=torch.float64) * room).long()
    index = (offsets[:, None] + torch.arange(resolution))[:, None, None, :].expand(b, c, resolution, resolution)
    out = torch.gather(images, 3, index)
    if bool(portrait.any()):
        out[portrait] = out[portrait].transpose(-1, -2).contiguous()
    return out


class CachedImages(Dataset):
    """The memory-mapped cache: a batch is one gather (``__getitems__``), no decoding.

    The array is opened lazily in each process (DataLoader workers included), never pickled.
    """

    def __init__(self, path: Path, rows: int, labels: np.ndarray | None, strips: np.ndarray | None,
                 resolution: int, seed: int = 0) -> None:
        self.path, self.rows, self.resolution = path, rows, resolution
        self.labels = None if labels is None else torch.as_tensor(labels, dtype=torch.int64)
        self.strips = None if strips is None else torch.as_tensor(strips.astype(np.int64))
        self.generator = torch.Generator().manual_seed(seed)
        self._array: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return self._array

    def __len__(self) -> int:
        return self.rows

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor | None]:
        idx = np.asarray(indices, dtype=np.int64)
        images = torch.from_numpy(self.array[idx])  # fancy indexing copies: the batch owns its memory
        if self.strips is not None:
            strips = self.strips[torch.from_numpy(idx)]
            images = random_window(images, strips[:, 0], strips[:, 1].bool(), self.resolution, _rng(self.generator))
        labels = None if self.labels is None else self.labels[torch.from_numpy(idx)]
        return images, labels

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor | None]:
        images, labels = self.__getitems__([index])
        return images[0], None if labels is None else labels[0]


class DecodedImages(Dataset):
    """Decodes each item when it is drawn (sets larger than the memory budget), in DataLoader workers.

    A file that fails now although the scan read it (deleted, truncated, replaced during training) is
    skipped: it is flagged in shared memory (every worker then skips it at once, and :attr:`failures`
    counts each such file once) and the next readable item is returned instead, so a batch keeps its size.
    """

    def __init__(self, source: ImageSource, names: Sequence[str], labels: np.ndarray | None, resolution: int,
                 channels: int, crop: str, background: str, seed: int = 0) -> None:
        import multiprocessing

        self.source, self.names = source, list(names)
        self.labels = None if labels is None else torch.as_tensor(labels, dtype=torch.int64)
        self.resolution, self.channels, self.crop, self.background = resolution, channels, crop, background
        self.generator = torch.Generator().manual_seed(seed)
        # One flag per item in shared memory: every worker sees which files went bad (and skips them at
        # once), and the main process counts them. Inherited by the workers, whatever their start method.
        self.bad = multiprocessing.get_context("spawn").RawArray("b", max(1, len(self.names)))
        self._logged = 0

    @property
    def failures(self) -> int:
        """Distinct files that failed since the scan (counted over all worker processes)."""
        return int(np.frombuffer(self.bad, dtype=np.int8).sum())

    def __len__(self) -> int:
        return len(self.names)

    def _decode(self, index: int) -> Tensor:
        array = image_decode.decode_bytes_or_path(self.source.open(self.names[index]), self.resolution,
                                                  self.channels, self.crop, self.background)
        images = torch.from_numpy(array)
        if self.crop == "random":
            portrait = images.shape[1] > images.shape[2]
            strip = images.transpose(1, 2) if portrait else images
            images = random_window(strip[None].contiguous(), torch.tensor([strip.shape[-1]]), torch.tensor([portrait]),
                                   self.resolution, _rng(self.generator))[0]
        return images

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor | None]:
        tries = 0
        for step in range(len(self.names)):
            current = (index + step) % len(self.names)
            if self.bad[current]:
                continue
            try:
                images = self._decode(current)
            except MemoryError:
                raise
            except Exception as error:  # any Pillow error on a file that changed: skip it, count it
                self.bad[current] = 1
                tries += 1
                if tries >= _REPLACEMENT_TRIES:
                    break
                if self._logged < _FAILURES_LOGGED:
                    self._logged += 1
                    print(f"gan_accel: warning: skipped {self.names[current]} ({skip_reason(error)}; it was readable "
                          "when the data was scanned)", file=sys.stderr)
                continue
            return images, None if self.labels is None else self.labels[current]
        raise DataError(f"{tries} images in a row from {self.names[index]} on can no longer be read (the data is "
                        f"changing under training): restore {self.source.description} and resume")


class ImageCollate:
    """Fetched items -> ``(float32 (B, C, R, R) in [-1, 1], int64 labels)``, or the images alone without labels.

    ``random_flip`` mirrors each image left-right with probability 1/2, on the uint8 batch (one
    ``where`` for the batch). A class, not a closure, so DataLoader workers can pickle it.
    """

    def __init__(self, has_labels: bool, random_flip: bool = False, seed: int = 0) -> None:
        self.has_labels, self.random_flip = has_labels, random_flip
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, batch: Any) -> Tensor | tuple[Tensor, Tensor]:
        if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], Tensor) and batch[0].dim() == 4:
            images, labels = batch
        else:  # per-item fetches: a list of (image, label)
            images = torch.stack([item[0] for item in batch])
            labels = torch.stack([item[1] for item in batch]) if self.has_labels else None
        if self.random_flip:
            flip = torch.rand(images.shape[0], generator=_rng(self.generator)) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
        # uint8_to_float's arithmetic, in place: one float allocation per batch instead of three
        x = images.float().div_(127.5).sub_(1)
        return (x, labels.to(torch.int64)) if self.has_labels else x


@dataclass
class ImageData:
    """A scanned image set, ready to load: see :func:`open_image_data` (which builds it)."""

    source: ImageSource
    report: ScanReport
    names: list[str]  # the images trained on, in order (row i of the data set)
    labels: np.ndarray | None  # int64 (N,), None without labels
    class_names: list[str] | None
    resolution: int
    channels: int
    crop: str
    background: str
    fingerprint: str  # changes when the files or the preprocessing change
    cache: CacheFolder
    prep: str
    cached: bool  # True: the memory-mapped cache; False: decoded per item in DataLoader workers
    note: str  # why the set is not cached ("" when it is)
    upscaled: int = 0  # images whose short side is below the resolution
    num_processes: int = 1
    process_index: int = 0
    _dataset: Dataset | None = None

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:  # the default would print every name and label
        return (f"ImageData({self.report.source!r}, {len(self):,} images, {self.channels}x{self.resolution}x"
                f"{self.resolution}, crop={self.crop!r}, classes={len(self.class_names or [])}, "
                f"{'cached' if self.cached else 'per item'}, fingerprint={self.fingerprint!r})")

    @property
    def skipped_files(self) -> list[SkippedFile]:
        """Every candidate file not trained on, with its reason (scan and cache build)."""
        return list(self.report.skipped)

    @property
    def skipped_list_path(self) -> Path:
        """The full list of skipped files, as the cache keeps it."""
        return self.cache.path / f"{self.prep}.skipped.txt"

    def dataset(self, seed: int = 0) -> Dataset:
        """The uint8 dataset behind :meth:`dataloader`: items ``(uint8 (C, R, R), label or None)``."""
        if self._dataset is None:
            if self.cached:
                strips = None
                if self.crop == "random":
                    strips = np.load(self.cache.strips(self.prep), allow_pickle=False)
                self._dataset = CachedImages(self.cache.images(self.prep), len(self.names), self.labels, strips,
                                             self.resolution, seed)
            else:
                self._dataset = DecodedImages(self.source, self.names, self.labels, self.resolution, self.channels,
                                              self.crop, self.background, seed)
        return self._dataset

    @property
    def failed_during_training(self) -> int:
        """Files skipped because they failed after the scan (per-item path; always 0 for the cache)."""
        dataset = self._dataset
        return dataset.failures if isinstance(dataset, DecodedImages) else 0

    def dataloader(self, batch_size: int, *, shuffle: bool = True, drop_last: bool = True, random_flip: bool = False,
                   num_workers: int | None = None, seed: int = 0, generator: torch.Generator | None = None,
                   pin_memory: bool = False) -> DataLoader:
        """Batches of ``(float32 (B, C, R, R) in [-1, 1], int64 labels)`` (images alone without labels).

        ``num_workers`` defaults to 0 for the cache (a batch is one memory copy: worker processes would
        only add transfers) and to the cores per process, at most 8, for per-item decoding. Augmentation
        (``random_flip``, ``crop="random"``) draws from its own generator seeded by ``seed``: the
        training noise is not shifted. Raises :class:`DataError` when the data holds fewer images than
        one batch on every process.
        """
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        needed = batch_size * self.num_processes if drop_last else self.num_processes
        if len(self) < needed:
            per = f" ({self.num_processes} processes x {batch_size})" if self.num_processes > 1 else ""
            raise DataError(f"{self.report.source} has {len(self):,} usable images, fewer than one batch of "
                            f"{needed:,}{per}: lower --batch-size or add images")
        if num_workers is None:
            num_workers = 0 if self.cached else max(1, min(8, _cpus() // max(1, _local_processes())))
        if generator is None:
            generator = torch.Generator().manual_seed(seed)
        # Augmentation seeds differ per process: each process flips and crops its own share independently.
        augment_seed = (seed + 1) * 1_000_003 + self.process_index
        return DataLoader(
            self.dataset(augment_seed), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
            num_workers=num_workers, collate_fn=ImageCollate(self.labels is not None, random_flip, augment_seed + 1),
            generator=generator,
            pin_memory=pin_memory, persistent_workers=num_workers > 0,
        )

    def describe(self) -> str:
        """One line: what will be trained on and how it is loaded."""
        path = f"memory-mapped from {self.cache.images(self.prep)}" if self.cached else \
            f"decoded per item in DataLoader workers ({self.note})"
        smaller = self.upscaled
        up = f"; {smaller:,} smaller than {self.resolution} px are upscaled" if smaller else ""
        return (f"gan_accel: data: {self.report.summary()} -> {len(self):,} images of {self.channels} channel"
                f"{'s' if self.channels > 1 else ''} at {self.resolution}x{self.resolution} ({self.crop} crop{up}), "
                f"{path}")

    def run_record(self) -> dict[str, Any]:
        """What a run folder keeps about its data (``data.json``): enough to refuse changed data on resume."""
        return {"source": self.report.source, "fingerprint": self.fingerprint, "images": len(self),
                "resolution": self.resolution, "channels": self.channels, "crop": self.crop,
                "background": self.background, "class_names": self.class_names, "classes": self.report.classes,
                "skipped": len(self.report.skipped)}

    def write_run_files(self, folder: str | os.PathLike) -> list[Path]:
        """Write ``data.json`` (:meth:`run_record`), ``class_names.json`` (with labels) and
        ``skipped_files.txt`` (when files were skipped: "name<TAB>reason" lines) into a run folder."""
        folder = Path(folder)
        files = {DATA_RECORD: json.dumps(self.run_record(), indent=2) + "\n"}
        if self.class_names is not None:
            files[CLASS_NAMES] = json.dumps(self.class_names, indent=2) + "\n"
        if self.report.skipped:
            files[SKIPPED_FILES] = skipped_text(self.report.skipped)
        for name, text in files.items():
            write_text_atomic(folder / name, text)
        return [folder / name for name in files]

    def check_resume(self, folder: str | os.PathLike, allow_changed: bool = False,
                     log: Callable[[str], Any] | None = print) -> bool:
        """Compare with the ``data.json`` a run folder kept; True when the data is the same.

        Changed data raises :class:`DataError` (one line saying what changed and how to go on) unless
        ``allow_changed``, which logs one warning line instead. A run folder without ``data.json``
        (trained on something else) is accepted.
        """
        path = Path(folder) / DATA_RECORD
        try:
            saved = json.loads(path.read_text())
        except FileNotFoundError:
            return True
        except (OSError, ValueError) as error:
            raise DataError(f"{path} cannot be read ({error}): restore it, or pass --allow-data-change") from None
        if saved.get("fingerprint") == self.fingerprint:
            return True
        now = self.run_record()
        changes = [f"{key} {saved.get(key)!r} -> {now[key]!r}" for key in
                   ("source", "images", "resolution", "channels", "crop", "background", "class_names")
                   if saved.get(key) != now[key]]
        what = "; ".join(changes) if changes else "files were added, removed or modified"
        message = f"the training data changed since this run started ({what})"
        if not allow_changed:
            raise DataError(f"{message}: restore it, or pass --allow-data-change to go on with the data as it is now")
        if log is not None:
            log(f"gan_accel: warning: {message}; going on with the data as it is now (--allow-data-change)")
        return False


def skipped_text(skipped: Sequence[SkippedFile]) -> str:
    """The full list of skipped files: one "name<TAB>reason" line each."""
    return "".join(f"{s.name}\t{s.reason}\n" for s in skipped)


def _is_builder(accelerator: Any) -> tuple[bool, str]:
    """Whether this process builds, and a token naming this call on every process (collective).

    The builder is the first process (by rank) of each machine, machines told apart by host name
    (LOCAL_RANK cannot say it: some launchers, accelerate's debug launcher among them, leave it 0 on
    every process). The token is the first process's: the status file of this build is named after it.
    """
    if accelerator is None or accelerator.num_processes == 1:
        return True, ""
    import socket
    import uuid

    from accelerate.utils import gather_object

    reports = gather_object([(socket.gethostname(), uuid.uuid4().hex)])
    hosts = [host for host, _ in reports]
    rank = accelerator.process_index
    return hosts.index(hosts[rank]) == rank, reports[0][1]


def _write_status(path: Path, state: str) -> None:
    write_text_atomic(path, json.dumps({"state": state}))


def _wait_for_status(path: Path, poll: float = 0.2) -> None:
    """Wait until the builder of this machine has written its status file ("done" or "error").

    A file, not a collective: a large build can take longer than the process group's timeout (30 min).
    """
    while True:
        try:
            if json.loads(path.read_text()).get("state") in ("done", "error"):
                return
        except (OSError, ValueError):
            pass
        time.sleep(poll)


def _local_processes() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)


def resolve_source(source: Any, *, split: str | None = None, image_column: str | None = None,
                   label_column: str | None = None, use_labels: bool = True, accelerator: Any = None) -> ImageSource:
    """A folder, a ``.zip``, ``hf:NAME[:SPLIT]`` / ``hf:FOLDER[:SPLIT]``, or a ``datasets`` object, as a source."""
    if not isinstance(source, (str, os.PathLike)):
        from .image_sources import import_datasets

        import_datasets()
        dataset, description = pick_split(source, split, f"the {type(source).__name__} passed")
        return HFSource(dataset, description, image_column, label_column, use_labels)
    text = os.fspath(source)
    if text.startswith("hf:"):
        import contextlib

        first = accelerator.main_process_first() if accelerator is not None else contextlib.nullcontext()
        error: GanAccelError | None = None
        with first:  # the first process downloads into the Hugging Face cache, the others then read it
            try:
                loaded, description = load_hf(text, split)
            except GanAccelError as caught:  # caught inside: escaping would skip the block's closing barrier
                error = caught
        if accelerator is not None and accelerator.num_processes > 1:
            from ..ending import raise_together

            raise_together(accelerator, error)
        elif error is not None:
            raise error
        dataset, description = pick_split(loaded, split, description)
        return HFSource(dataset, description, image_column, label_column, use_labels)
    path = Path(text).expanduser()
    if path.is_dir():
        return FolderSource(path)
    if not path.exists():
        raise DataError(f"{path} does not exist: pass a folder of images, a .zip of them, or hf:NAME for a "
                        "Hugging Face dataset")
    if path.suffix.lower() == ".zip" or _looks_like_zip(path):
        return ZipSource(path)
    raise DataError(f"{path} is a file, not a folder of images or a .zip: pass the folder that holds the images")


def _looks_like_zip(path: Path) -> bool:
    import zipfile

    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _validate(resolution: Any, channels: Any, crop: Any, labels: Any, background: Any) -> None:
    if isinstance(resolution, bool) or not isinstance(resolution, int) or \
            not MIN_RESOLUTION <= resolution <= MAX_RESOLUTION:
        raise DataError(f"resolution {resolution!r} cannot be used: choose a whole number of pixels from "
                        f"{MIN_RESOLUTION} to {MAX_RESOLUTION} (one the model can make)")
    if channels not in (None, 1, 3):
        raise DataError(f"channels {channels!r} cannot be used: choose 1 (grayscale) or 3 (RGB), or leave it out to "
                        "use what the data has")
    if crop not in CROPS:
        raise DataError(f"crop {crop!r} is unknown: choose {' or '.join(CROPS)}")
    if labels not in LABEL_MODES:
        raise DataError(f"labels {labels!r} is unknown: choose {', '.join(LABEL_MODES)}")
    if background not in BACKGROUNDS:
        raise DataError(f"background {background!r} is unknown: choose {' or '.join(BACKGROUNDS)}")


@dataclass
class _Assembled:
    report: ScanReport
    positions: list[int]  # entry index of each image used
    labels: np.ndarray | None
    class_names: list[str] | None
    upscaled: int


def _assemble(scan_data: dict[str, Any], source: ImageSource, names: list[str], labels_mode: str,
              failed: Sequence[Sequence[str]], resolution: int) -> _Assembled:
    """From the scan (and the build's failures): the images used, their labels, and the report."""
    items = [tuple(item) for item in scan_data["items"]]
    skipped = [SkippedFile(*s) for s in scan_data["skipped"]]
    positions = [item[0] for item in items]
    class_of: list[str] | None = None
    class_names: list[str] | None = None
    reason = ""
    label_ids: list[int] | None = None
    if labels_mode != "none":
        given = source.labels()
        if given is not None:
            all_ids, class_names = given
            label_ids = [all_ids[p] for p in positions]
        elif source.has_folder_layout:
            class_of, reason = folder_classes([names[p] for p in positions])
            if class_of is not None:
                class_names = sorted(set(class_of))
                index = {name: i for i, name in enumerate(class_names)}
                label_ids = [index[c] for c in class_of]
        else:
            reason = f"{source.description} has no class column (name one with --label-column)"
    failed_names = {name for name, _ in failed}
    if failed_names:
        keep = [i for i, p in enumerate(positions) if names[p] not in failed_names]
        items = [items[i] for i in keep]
        positions = [positions[i] for i in keep]
        label_ids = None if label_ids is None else [label_ids[i] for i in keep]
        skipped = skipped + [SkippedFile(name, why) for name, why in failed]
    classes = None
    if class_names is not None and label_ids is not None:
        counts = np.bincount(np.asarray(label_ids, dtype=np.int64), minlength=len(class_names))
        classes = {name: int(n) for name, n in zip(class_names, counts)}
    modes: dict[str, int] = {}
    for _, _, _, mode, grey in items:
        family = mode_family(mode, grey)
        modes[family] = modes.get(family, 0) + 1
    report = ScanReport(
        source=source.description, files=len(names), count=len(items), sizes=size_summary(items), modes=modes,
        grey=bool(items) and all(item[4] for item in items), classes=classes,
        no_labels_reason="" if classes else (reason or ("labels='none'" if labels_mode == "none" else "")),
        skipped=skipped,
    )
    labels = None if label_ids is None else np.asarray(label_ids, dtype=np.int64)
    upscaled = sum(1 for _, w, h, _, _ in items if min(w, h) < resolution)
    return _Assembled(report, positions, labels, class_names, upscaled)


def listed_source(source: Any, split: str | None, image_column: str | None, label_column: str | None, labels: str,
                  accelerator: Any) -> tuple[ImageSource, list[Any]]:
    """The source and its listing; one-line :class:`DataError` when it holds no files."""
    src = resolve_source(source, split=split, image_column=image_column, label_column=label_column,
                         use_labels=labels != "none", accelerator=accelerator)
    entries = src.entries()
    if not entries:
        raise DataError(f"{src.description} holds no files (hidden files are ignored): pass the folder that holds "
                        "the images")
    return src, entries


def open_image_data(source: str | os.PathLike | Any, resolution: int, channels: int | None = None,
                    crop: str = "center", labels: str = "auto", *, split: str | None = None,
                    image_column: str | None = None, label_column: str | None = None, background: str = "white",
                    cache_dir: str | os.PathLike | None = None, memory_budget: int | None = None,
                    batch_size: int | None = None, accelerator: Any = None, build_workers: int | None = None,
                    log: Callable[[str], Any] | None = print) -> ImageData:
    """Scan an image source, check it, decode it into the cache when it fits, and describe it.

    Args:
        source: a folder (recursive), a ``.zip``, ``"hf:NAME[:SPLIT]"`` (a Hugging Face Hub dataset),
            ``"hf:FOLDER[:SPLIT]"`` (the ``imagefolder`` builder on a local folder), or a
            ``datasets.Dataset`` / ``DatasetDict``. See :mod:`gan_accel.data.image_sources` for the class rule.
        resolution: the side R of the square images trained on (8 to 4096).
        channels: 1 or 3; None: 1 when every image is grayscale, else 3.
        crop: "center" (the central square), or "random" (a random R x R window of the image resized
            so its short side is R, long side kept up to 1.5 R; chosen anew at every draw).
        labels: "auto" (classes when the source has them), "none", or "required" (a conditional run:
            data without classes is a :class:`DataError`).
        split, image_column, label_column: for Hugging Face datasets (columns found by feature type:
            ``Image`` and ``ClassLabel``, when not named).
        background: what transparent pixels become, "white" or "black".
        cache_dir: the cache root (default :func:`~gan_accel.data.image_cache.default_cache_root`).
        memory_budget: the largest uint8 array (bytes) decoded into the cache; larger sets are decoded
            per item in DataLoader workers. Default: a quarter of the physical memory; 0: never cache.
        batch_size: when given, fewer images than one batch on every process is refused before decoding.
        accelerator: under ``accelerate launch``: one process per machine builds, the others wait.
        build_workers: processes decoding the cache build (default: the cores, at most 8, from 2,048 images).
        log: where the summary and the warning lines go (the main process only); None: silent.

    Raises:
        DataError: one line naming the problem and the fix (missing or empty source, not a ZIP, no
            readable image, no labels with ``labels="required"``, fewer images than a batch, bad settings).
    """
    _validate(resolution, channels, crop, labels, background)
    builder, token = _is_builder(accelerator)
    speaker = accelerator is None or accelerator.is_main_process
    say = log if (speaker and log is not None) else (lambda _line: None)

    src, entries = listed_source(source, split, image_column, label_column, labels, accelerator)
    names = [e.name for e in entries]
    key = scan_key(src.identity(), entries)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    cache = CacheFolder(root, key)
    budget = default_memory_budget() if memory_budget is None else memory_budget

    _build_once(accelerator, builder, token, root, lambda: _build(
        src, entries, cache, resolution, channels, crop, labels, background, budget, batch_size, build_workers,
        accelerator, say))
    data = _load(src, names, cache, resolution, channels, crop, labels, background, key, budget, builder)
    if accelerator is not None:
        data.num_processes, data.process_index = accelerator.num_processes, accelerator.process_index
    for line in (data.describe(), data.report.skipped_warning(str(data.skipped_list_path))):
        if line:  # the summary, and the one warning line when files were skipped
            say(line)
    return data


def _build_once(accelerator: Any, builder: bool, token: str, root: Path, build: Callable[[], None]) -> None:
    """Run ``build`` on the builder while the other processes of its machine wait; every process then
    raises the builder's error, if any (a bug included: no process is left waiting)."""
    multi = accelerator is not None and accelerator.num_processes > 1
    error: BaseException | None = None
    if builder:
        try:
            build()
        except (GanAccelError, OSError) as caught:
            error = caught if isinstance(caught, GanAccelError) else _cache_error(caught, root)
        except Exception as caught:  # a bug: the other processes must not wait for the build forever
            if not multi:
                raise
            error = caught
    if not multi:
        if error is not None:
            raise error
        return
    import tempfile

    from ..ending import raise_together

    # In the machine's temporary folder: per machine, like the builder, and writable even when the
    # cache folder is not (then the builder's error must still reach the others).
    status = Path(tempfile.gettempdir()) / f"gan_accel-image-build-{token}.status"
    if builder:
        _write_status(status, "error" if error is not None else "done")
    else:
        _wait_for_status(status)
    try:
        raise_together(accelerator, error)  # every process raises the builder's error, if any
    finally:
        if builder:  # every process of this machine has read it: they are all in raise_together
            status.unlink(missing_ok=True)


def _cache_error(error: OSError, root: Path) -> DataError:
    reason = f"{os.strerror(error.errno)}" if error.errno else (str(error) or type(error).__name__)
    return DataError(f"cannot write the image cache at {error.filename or root}: {reason}; choose another place "
                     "with cache_dir (or $GAN_ACCEL_CACHE)")


def _resolved_channels(channels: int | None, report: ScanReport) -> int:
    return channels if channels is not None else (1 if report.grey else 3)


def _build(src: ImageSource, entries: list, cache: CacheFolder, resolution: int, channels: int | None, crop: str,
           labels: str, background: str, budget: int, batch_size: int | None, build_workers: int | None,
           accelerator: Any, say: Callable[[str], Any]) -> None:
    """On the builder: scan (or reuse the scan), check, and decode into the cache when it fits."""
    names = [e.name for e in entries]
    scan_data = cached_scan(src, entries, cache)
    assembled = _assemble(scan_data, src, names, labels, (), resolution)
    report = assembled.report
    if report.count == 0:
        examples = ", ".join(f"{s.name} ({s.reason})" for s in report.skipped[:3])
        raise DataError(f"{src.description} holds no readable image among its {len(entries):,} files (e.g. "
                        f"{examples}): pass a folder of PNG, JPEG, WebP, BMP, GIF or TIFF images")
    if labels == "required" and assembled.labels is None:
        raise DataError(f"a conditional run needs labels, and {src.description} has none "
                        f"({report.no_labels_reason}): put each class's images in a subfolder named after it, "
                        "name a class column with --label-column, or train unconditionally")
    processes = accelerator.num_processes if accelerator is not None else 1
    if batch_size is not None and report.count < batch_size * processes:
        raise DataError(f"{src.description} has {report.count:,} readable images, fewer than one batch of "
                        f"{batch_size * processes:,}: lower --batch-size or add images")
    c = _resolved_channels(channels, report)
    prep = prep_name(resolution, c, crop, background)
    within, note = _within_budget(report.count, c, resolution, crop, budget)
    if not within:
        return  # decoded per item: nothing to build
    done = cache.read_json(cache.prep_json(prep))
    if done is not None and done["cached"] and cache.open_images(prep, done["rows"]) is not None:
        return  # a complete cache: nothing is decoded again
    positions = assembled.positions
    n = len(positions)
    size = n * c * resolution * strip_width(resolution, crop)
    free = image_cache.free_bytes(cache.path)
    failed: list[tuple[str, str]] = []
    if free < size * 1.05 + (64 << 20):
        note = f"{size / 1e9:,.2f} GB decoded does not fit the {free / 1e9:,.2f} GB free at {cache.root}"
        cache.write_json(cache.prep_json(prep), {"cached": False, "note": note, "rows": 0, "failed": []})
        return
    workers = build_workers if build_workers is not None else (min(8, _cpus()) if n >= 2048 else 0)
    say(f"gan_accel: decoding {n:,} images into the cache {cache.images(prep)} ({size / 1e6:,.1f} MB), "
        f"{workers or 'no'} worker processes ...")
    start = time.perf_counter()
    failures = build_images(cache, prep, src, [names[p] for p in positions], resolution, c, crop, background,
                            workers, progress=lambda k: say(f"gan_accel: ... {k:,} of {n:,} decoded"))
    seconds = time.perf_counter() - start
    failed = [(s.name, s.reason) for _, s in failures]
    say(f"gan_accel: cached {n - len(failed):,} images in {seconds:.1f} s ({n / max(seconds, 1e-9):,.0f} images/s)")
    if len(failed) == n:
        raise DataError(f"none of the {n:,} images of {src.description} could be decoded (e.g. {failed[0][0]}: "
                        f"{failed[0][1]}): check the files")
    cache.write_json(cache.prep_json(prep), {"cached": True, "note": "", "rows": n - len(failed), "failed": failed})


def cached_scan(src: ImageSource, entries: list, cache: CacheFolder) -> dict[str, Any]:
    """The scan of ``entries`` (:func:`~gan_accel.data.image_scan.scan`), read from the cache or made and cached:
    ``{"source", "items": [(entry index, width, height, mode, grey), ...], "skipped": [[name, reason], ...]}``."""
    scan_data = cache.read_json(cache.scan_json)
    if scan_data is None:
        start = time.perf_counter()
        result = scan(src, entries)
        scan_data = {"source": src.description, "items": result.items,
                     "skipped": [[s.name, s.reason] for s in result.skipped],
                     "seconds": round(time.perf_counter() - start, 3)}
        cache.write_json(cache.scan_json, scan_data)
    return scan_data


def _within_budget(count: int, channels: int, resolution: int, crop: str, budget: int) -> tuple[bool, str]:
    """Whether the decoded set fits the memory budget, and why not."""
    size = count * channels * resolution * strip_width(resolution, crop)
    if budget <= 0:
        return False, "caching is off: memory_budget=0"
    if size > budget:
        return False, f"{size / 1e9:,.2f} GB decoded is more than the memory budget of {budget / 1e9:,.2f} GB"
    return True, ""


def _load(src: ImageSource, names: list[str], cache: CacheFolder, resolution: int, channels: int | None, crop: str,
          labels: str, background: str, key: str, budget: int, builder: bool) -> ImageData:
    """On every process, after the build: the ImageData the cache files describe."""
    scan_data = cache.read_json(cache.scan_json)
    if scan_data is None:
        raise DataError(f"the scan of {src.description} is missing from {cache.path}: the data changed while it "
                        "was being read, or the cache was removed; start again")
    first = _assemble(scan_data, src, names, labels, (), resolution)
    c = _resolved_channels(channels, first.report)
    prep = prep_name(resolution, c, crop, background)
    within, note = _within_budget(first.report.count, c, resolution, crop, budget)
    cached, failed = False, []
    if within:
        done = cache.read_json(cache.prep_json(prep))
        if done is None:
            raise DataError(f"the image cache {cache.prep_json(prep)} is missing: the data changed while it was "
                            "being read, or the cache was removed; start again")
        cached, failed, note = bool(done["cached"]), done["failed"], done["note"]
        if cached and cache.open_images(prep, done["rows"]) is None:
            raise DataError(f"the image cache {cache.images(prep)} is missing or incomplete: remove {cache.path} and "
                            "start again")
    assembled = _assemble(scan_data, src, names, labels, failed, resolution)
    skipped_list = cache.path / f"{prep}.skipped.txt"
    if builder:  # the full list the warning line points to
        write_text_atomic(skipped_list, skipped_text(assembled.report.skipped))
    fingerprint = hashlib.sha256(f"{key}\0{prep}\0{image_cache.CACHE_VERSION}".encode()).hexdigest()[:16]
    data = ImageData(source=src, report=assembled.report, names=[names[p] for p in assembled.positions],
                     labels=assembled.labels, class_names=assembled.class_names, resolution=resolution, channels=c,
                     crop=crop, background=background, fingerprint=fingerprint, cache=cache, prep=prep, cached=cached,
                     note=note, upscaled=assembled.upscaled)
    return data
