"""Train on your own images: a folder, a ZIP or a Hugging Face dataset, listed once, scanned once, decoded once.

    data = open_image_data("photos/", resolution=64)      # list, scan, check, cache (or not), report
    loader = data.dataloader(batch_size=64, random_flip=True)
    # batches: float32 (B, C, R, R) in [-1, 1], and int64 labels when the data has classes

Or in two steps, when the resolution depends on the images (``gan-accel train``'s default):

    images = scan_images("photos/")                       # list the source, scan every header (cached)
    data = images.open(Preprocessing(choose(images.sizes)))

1. **List** the source (names, sizes, change stamps; nothing opened) and hash the listing into the cache key.
2. **Scan** every header: unreadable or truncated files are skipped and named in one warning line; whatever
   the user can fix is one :class:`~gan_accel.errors.DataError` line, before any pixel is decoded.
3. **Decode once** into the cache when the uint8 array fits ``memory_budget``; every process memory-maps
   that file (one copy in the page cache, a batch is one gather). A larger set is decoded per item in
   DataLoader workers, where a file that turns bad after the scan is skipped and counted.

Under ``accelerate launch``, pass ``accelerator``: the first process on each machine scans and builds
while the others wait (:mod:`~gan_accel.data.build_once`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ..errors import DataError, UnsafeFileError
from ..storage.files import free_space, write_bytes_synced
from ..storage.reading import load_array
from ..storage.layout import (CHECKPOINTS, CLASS_NAMES, DATA_RECORD, EXPORT_WEIGHTS, GENERATOR, HISTORY, SKIPPED_FILES,
                              read_json)
from ..text import printable
from . import image_cache, image_decode
from .build_once import Builder, build_once, builder_of
from .image_cache import CacheFolder, default_cache_root, within_budget
from .image_decode import Preprocessing
from .image_scan import DAMAGED_ZIP, ScanReport, Selection, SkippedFile, select, skipped_text
from .image_sources import Entry, ImageSource, resolve_source
from .loader import DecodedImages, UInt8Collate, UInt8ImageDataset

LABEL_MODES = ("auto", "none", "required")
PREP_KEYS = ("resolution", "channels", "crop", "background")  # --flags a run keeps
EVAL_IMAGES = 10_000  # real images evaluation compares samples with (gan-accel train --eval-every, eval --data)
# The held-out slice of gan-accel train (D's overfitting check): 5% of the images, at most 64 (D's probe uses
# 64), and none under 40 images, where every image counts for training and 2 held out would say little.
HOLD_OUT_FRACTION, HOLD_OUT_CAP, HOLD_OUT_MIN_IMAGES = 0.05, 64, 40


def held_out_count(images: int, batch_size: int = 1) -> int:
    """How many of ``images`` a new run holds out of training (:meth:`ImageData.hold_out`)."""
    if images < HOLD_OUT_MIN_IMAGES:
        return 0
    return max(0, min(HOLD_OUT_CAP, math.ceil(HOLD_OUT_FRACTION * images), images - batch_size))


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _check_batch(where: str, count: int, batch_size: int, processes: int) -> None:
    if count < batch_size * processes:
        per = f" ({processes} processes x {batch_size})" if processes > 1 else ""
        raise DataError(f"{where} has {count:,} readable images, fewer than one batch of {batch_size * processes:,}"
                        f"{per}: lower --batch-size or add images")


@dataclass
class ImageData:
    """A scanned image set, ready to load: see :func:`open_image_data` (which builds it)."""

    source: ImageSource
    report: ScanReport
    names: list[str]  # the images trained on, in order (row i of the data set)
    labels: np.ndarray | None  # int64 (N,), None without labels
    class_names: list[str] | None
    prep: Preprocessing  # channels settled
    fingerprint: str  # changes when the files or the preprocessing change
    cache: CacheFolder
    cached: bool  # True: the memory-mapped cache; False: decoded per item in DataLoader workers
    note: str  # why the set is not cached ("" when it is)
    upscaled: int = 0  # images whose short side is below the resolution
    num_processes: int = 1
    process_index: int = 0
    held_out_rows: tuple[int, ...] = ()  # rows never trained on (:meth:`hold_out`), in order
    _dataset: Dataset | None = None

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:  # the default would print every name and label
        p = self.prep
        return (f"ImageData({self.report.source!r}, {len(self):,} images, {p.channels}x{p.resolution}x{p.resolution}, "
                f"crop={p.crop!r}, classes={len(self.class_names or [])}, "
                f"{'cached' if self.cached else 'per item'}, fingerprint={self.fingerprint!r})")

    @property
    def skipped_files(self) -> list[SkippedFile]:
        """Every candidate file not trained on, with its reason (scan and cache build)."""
        return list(self.report.skipped)

    @property
    def skipped_list_path(self) -> Path:
        """The full list of skipped files, as the cache keeps it."""
        return self.cache.file(self.prep, ".skipped.txt")

    @property
    def trained_on(self) -> int:
        """The images trained on: all of them but the held-out slice."""
        return len(self) - len(self.held_out_rows)

    def hold_out(self, seed: int = 0, *, batch_size: int = 1, recorded: list[str] | None = None) -> int:
        """Keep a slice of the images out of training, for D's overfitting check; returns its size.

        ``recorded``: the names a run held out (its ``data.json``), kept as they are so a resumed run trains on
        the same images. Else :data:`HOLD_OUT_FRACTION` of them, at most :data:`HOLD_OUT_CAP`, none under
        :data:`HOLD_OUT_MIN_IMAGES` images, and never so many that fewer than ``batch_size`` stay for training:
        a choice fixed by ``seed`` and the images, the same on every process. Call before :meth:`dataloader`.
        """
        if recorded is not None:
            wanted = set(recorded)
            rows = [row for row, name in enumerate(self.names) if name in wanted]
        else:  # its own generator, offset from the seed: not the first images of real_images' (evaluation's) choice
            order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed + 7919))
            rows = order[:held_out_count(len(self), batch_size)].tolist()
        self.held_out_rows = tuple(sorted(rows))
        return len(self.held_out_rows)

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The held-out images (uint8 (N, C, R, R), centre crops) and their labels (None without labels)."""
        images, rows = self._rows(np.asarray(self.held_out_rows, dtype=np.int64))
        return images, None if self.labels is None else torch.as_tensor(self.labels[rows], dtype=torch.int64)

    def dataset(self, seed: int = 0) -> Dataset:
        """The uint8 dataset behind :meth:`dataloader`: items ``(uint8 (C, R, R), label or None)``, the
        held-out images left out."""
        if self.held_out_rows:
            kept = sorted(set(range(len(self))) - set(self.held_out_rows))
            return Subset(self._whole(seed), kept)
        return self._whole(seed)

    def _whole(self, seed: int) -> Dataset:
        if self._dataset is None:
            if self.cached:
                random = self.prep.crop == "random"
                strips = load_array(self.cache.file(self.prep, ".strips.npy")) if random else None
                self._dataset = UInt8ImageDataset(self.cache.file(self.prep, ".npy"), self.labels, strips=strips,
                                                  resolution=self.prep.resolution, seed=seed)
            else:
                self._dataset = DecodedImages(self.source, self.names, self.labels, self.prep, seed)
        return self._dataset

    @property
    def failed_during_training(self) -> int:
        """Files skipped because they failed after the scan (per-item path; always 0 for the cache)."""
        dataset = self._dataset
        return dataset.failures if isinstance(dataset, DecodedImages) else 0

    def dataloader(self, batch_size: int, *, shuffle: bool = True, drop_last: bool = True, random_flip: bool = False,
                   num_workers: int | None = None, seed: int = 0) -> DataLoader:
        """Batches of ``(float32 (B, C, R, R) in [-1, 1], int64 labels)`` (images alone without labels).

        ``num_workers`` defaults to 0 for the cache (a batch is one memory copy: worker processes would
        only add transfers) and to the cores per process, at most 8, for per-item decoding. Augmentation
        (``random_flip``, ``crop="random"``) draws from its own generator seeded by ``seed``: the
        training noise is not shifted. Raises :class:`DataError` when the data holds fewer images than
        one batch on every process.
        """
        if batch_size < 1:
            raise DataError(f"batch_size must be >= 1, got {batch_size}")
        _check_batch(self.report.source, self.trained_on, batch_size if drop_last else 1, self.num_processes)
        if num_workers is None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
            num_workers = 0 if self.cached else max(1, min(8, _cpus() // max(1, local)))
        # Augmentation seeds differ per process: each process flips and crops its own share independently.
        augment_seed = (seed + 1) * 1_000_003 + self.process_index
        return DataLoader(
            self.dataset(augment_seed), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
            num_workers=num_workers, collate_fn=UInt8Collate(self.labels is not None, random_flip, augment_seed + 1),
            generator=torch.Generator().manual_seed(seed), persistent_workers=num_workers > 0,
            worker_init_fn=functools.partial(image_cache.die_with_parent, parent=os.getpid()) if num_workers else None,
        )

    def real_images(self, count: int = EVAL_IMAGES, seed: int = 0) -> torch.Tensor:
        """``count`` images (at most all) as uint8 (N, C, R, R), for evaluation: a fixed choice by ``seed``,
        centre crops, no flips, the same on every process."""
        chosen = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:count]
        return self._rows(np.sort(chosen.numpy()))[0]

    def _rows(self, rows: np.ndarray) -> tuple[torch.Tensor, list[int]]:
        """Rows of the data set as uint8 (N, C, R, R), centre crops, no flips, and the rows they are (a file
        that turned bad after the scan is left out, as training skips it)."""
        if self.cached and self.prep.crop == "center":  # the memory-mapped cache holds exactly these crops
            array = load_array(self.cache.file(self.prep, ".npy"), mmap=True)
            return torch.from_numpy(np.ascontiguousarray(array[rows])), [int(row) for row in rows]
        centre, decoded, kept = replace(self.prep, crop="center"), [], []
        for row in rows:
            try:
                decoded.append(image_decode.decode_image(self.source.open(self.names[int(row)]), centre))
                kept.append(int(row))
            except Exception:  # a file that turned bad after the scan: training skips it too
                continue
        if not decoded:
            p = self.prep
            return torch.zeros((0, p.channels, p.resolution, p.resolution), dtype=torch.uint8), kept
        return torch.from_numpy(np.stack(decoded)), kept

    def describe(self) -> str:
        """One line: what will be trained on and how it is loaded."""
        p = self.prep
        path = f"memory-mapped from {self.cache.file(p, '.npy')}" if self.cached else \
            f"decoded per item in DataLoader workers ({self.note})"
        up = f"; {self.upscaled:,} smaller than {p.resolution} px are upscaled" if self.upscaled else ""
        return (f"gan_accel: data: {self.report.summary()} -> {len(self):,} images of {p.channels} channel"
                f"{'s' if p.channels > 1 else ''} at {p.resolution}x{p.resolution} ({p.crop} crop{up}), {path}")

    def run_record(self) -> dict[str, Any]:
        """What a run folder keeps about its data (``data.json``): enough to refuse changed data on resume."""
        return {"source": self.report.source, "fingerprint": self.fingerprint, "images": len(self),
                "resolution": self.prep.resolution, "channels": self.prep.channels, "crop": self.prep.crop,
                "background": self.prep.background, "class_names": self.class_names, "classes": self.report.classes,
                "skipped": len(self.report.skipped), "held_out": [self.names[row] for row in self.held_out_rows]}

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
            write_bytes_synced(folder / name, text.encode())
        return [folder / name for name in files]

    def check_resume(self, saved: dict[str, Any] | None, allow_changed: bool = False,
                     log: Callable[[str], Any] | None = print) -> bool:
        """Compare with the :meth:`run_record` a run kept (its ``data.json``); True when the data is the same.

        Changed data raises :class:`DataError` (one line saying what changed and how to go on) unless
        ``allow_changed``, which logs one warning line instead. No record (a run trained on something
        else) is accepted.
        """
        if saved is None or saved.get("fingerprint") == self.fingerprint:
            return True
        now = self.run_record()
        settings = [f"--{key} {now[key]} (the run's: {saved.get(key)})" for key in PREP_KEYS
                    if saved.get(key) is not None and saved.get(key) != now[key]]
        if settings and not allow_changed:  # a flag of this command changed, not the data: say so
            raise DataError(f"{', '.join(settings)}: a run goes on as it started; leave these flags out (or pass "
                            "the run's values), or start a new run in another --output-dir")
        changes = [f"{key} {saved.get(key)!r} -> {now[key]!r}" for key in ("source", "images", *PREP_KEYS,
                                                                             "class_names") if saved.get(key) != now[key]]
        what = "; ".join(changes) if changes else "files were added, removed or modified"
        message = f"the training data changed since this run started ({what})"
        if not allow_changed:
            raise DataError(f"{message}: restore it, or pass --allow-data-change to go on with the data as it is now")
        if log is not None:
            log(f"gan_accel: warning: {message}; going on with the data as it is now (--allow-data-change)")
        return False


@dataclass
class ImageScan:
    """A source listed and scanned (headers only), before a preprocessing is chosen: see :func:`scan_images`."""

    source: ImageSource
    entries: list[Entry]
    cache: CacheFolder
    key: str
    scan: dict[str, Any]  # what :meth:`CacheFolder.scan` returns
    labels: str
    accelerator: Any = None
    builder: Builder = Builder(True, "")

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """(width, height) of every readable image."""
        return [(int(item[1]), int(item[2])) for item in self.scan["items"]]

    def open(self, prep: Preprocessing, *, batch_size: int | None = None, memory_budget: int | None = None,
             build_workers: int | None = None, log: Callable[[str], Any] | None = print) -> ImageData:
        """Check the scanned images, decode them with ``prep`` into the cache when they fit, and describe them
        (the arguments are :func:`open_image_data`'s)."""
        acc = self.accelerator
        speaker = log is not None and (acc is None or acc.is_main_process)
        say = log if speaker else (lambda _line: None)
        names = [e.name for e in self.entries]
        chosen, prep = self.preview(prep, batch_size=batch_size)  # on every process: the same scan, the same line
        within, note = within_budget(prep, chosen.report.count, memory_budget)
        cached = False
        if within:
            build_once(acc, self.builder, "decode", lambda: self._decode(prep, chosen, build_workers, say),
                       self.cache.root)
            record = self.cache.file(prep, ".json")
            done = self.cache.read_json(record)
            if done is None:
                raise DataError(f"the image cache {record} is missing: the data changed while it was being read, or "
                                "the cache was removed; start again")
            cached, note = bool(done["cached"]), done["note"]  # the builder checked or wrote the array
            if done["failed"]:
                chosen = select(self.scan, self.source, names, self.labels, prep.resolution, done["failed"])
        if self.builder[0]:  # the full list the warning line points to
            write_bytes_synced(self.cache.file(prep, ".skipped.txt"), skipped_text(chosen.report.skipped).encode())
        fingerprint = hashlib.sha256(f"{self.key}\0{prep.name}\0{image_cache.CACHE_VERSION}".encode()).hexdigest()[:16]
        data = ImageData(source=self.source, report=chosen.report, names=[names[p] for p in chosen.positions],
                         labels=chosen.labels, class_names=chosen.class_names, prep=prep, fingerprint=fingerprint,
                         cache=self.cache, cached=cached, note=note, upscaled=chosen.upscaled)
        if acc is not None:
            data.num_processes, data.process_index = acc.num_processes, acc.process_index
        for line in (data.describe(), data.report.skipped_warning(str(data.skipped_list_path))):
            if line:  # the summary, and the one warning line when files were skipped (names escaped)
                say(printable(line))
        return data

    def preview(self, prep: Preprocessing, *, batch_size: int | None = None) -> tuple[Selection, Preprocessing]:
        """The images ``prep`` would use, checked as :meth:`open` checks them, and ``prep`` with its channels
        settled; from the scan alone: nothing is decoded or written (a file that fails to decode is found only
        by :meth:`open`)."""
        chosen = select(self.scan, self.source, [e.name for e in self.entries], self.labels, prep.resolution)
        self._check(chosen, batch_size)
        return chosen, prep.for_data(chosen.report.grey)

    def _check(self, chosen: Selection, batch_size: int | None) -> None:
        report, where = chosen.report, self.source.description
        if report.count == 0 and all(s.reason.startswith(DAMAGED_ZIP) for s in report.skipped):
            raise DataError(f"{where} is a damaged ZIP archive: none of the {len(self.entries):,} files its central "
                            f"directory lists is where it says ({report.skipped[0].reason}): re-create the archive, "
                            "or repair it (zip -FF)")
        if report.count == 0:
            examples = ", ".join(f"{s.name} ({s.reason})" for s in report.skipped[:3])
            raise DataError(f"{where} holds no readable image among its {len(self.entries):,} files (e.g. "
                            f"{examples}): pass a folder of PNG, JPEG, WebP, BMP, GIF or TIFF images")
        if self.labels == "required" and chosen.labels is None:
            raise DataError(f"a conditional run needs labels, and {where} has none ({report.no_labels_reason}): put "
                            "each class's images in a subfolder named after it, name a class column with "
                            "--label-column, or train unconditionally")
        if batch_size is not None:
            acc = self.accelerator
            _check_batch(where, report.count, batch_size, acc.num_processes if acc is not None else 1)

    def _decode(self, prep: Preprocessing, chosen: Selection, workers: int | None, say: Callable[[str], Any]) -> None:
        """On the builder: decode the chosen images into the cache, unless a complete cache is there."""
        cache, record = self.cache, self.cache.file(prep, ".json")
        done = cache.read_json(record, say)
        if cache.verified(prep, done, say):
            return  # a complete cache, every byte as it was written: nothing is decoded again
        n = len(chosen.positions)
        size, free = prep.bytes_for(n), free_space(cache.path) or 0
        if free < size * 1.05 + (64 << 20):
            note = f"{size / 1e9:,.2f} GB decoded does not fit the {free / 1e9:,.2f} GB free at {cache.root}"
            cache.write_json(record, {"cached": False, "note": note, "rows": 0, "failed": []})
            return
        workers = workers if workers is not None else (min(8, _cpus()) if n >= 2048 else 0)
        say(f"gan_accel: decoding {n:,} images into the cache {cache.file(prep, '.npy')} ({size / 1e6:,.1f} MB), "
            f"{workers or 'no'} worker processes ...")
        start = time.perf_counter()
        failed = image_cache.build_images(cache, prep, self.source, [self.entries[p].name for p in chosen.positions],
                                          workers, progress=lambda k: say(f"gan_accel: ... {k:,} of {n:,} decoded"))
        seconds = time.perf_counter() - start
        say(f"gan_accel: cached {n - len(failed):,} images in {seconds:.1f} s ({n / max(seconds, 1e-9):,.0f} images/s)")
        if len(failed) == n:
            raise DataError(f"none of the {n:,} images of {self.source.description} could be decoded (e.g. "
                            f"{failed[0][0]}: {failed[0][1]}): check the files")
        sums = {"images_sha256": image_cache.file_sha256(cache.file(prep, ".npy"))}
        if prep.crop == "random":
            sums["strips_sha256"] = image_cache.file_sha256(cache.file(prep, ".strips.npy"))
        cache.write_json(record, {"cached": True, "note": "", "rows": n - len(failed), "failed": failed, **sums})


def check_outside_data(data: str | os.PathLike, inner: str | os.PathLike, what: str, fix: str) -> None:
    """Refuse ``inner`` (the run folder, the cache) inside the data folder ``data``: its files would be read
    as training images, and change the data at every run. A hidden folder there is left out of the data."""
    text = os.fspath(data)
    text = text[3:] if text.startswith("hf:") else text
    folder = Path(text).expanduser()
    if not text.strip() or not folder.is_dir():  # "hf:" names no folder (not the current one): refused when loaded
        return
    try:
        parts = Path(inner).expanduser().resolve().relative_to(folder.resolve()).parts
    except ValueError:
        return
    if not any(part.startswith(".") for part in parts):
        raise DataError(f"{what} {inner} is inside the data folder {data}: its files would be read as training "
                        f"images; {fix}")


def check_not_a_run(data: str | os.PathLike) -> None:
    """Refuse a gan_accel run folder (or a checkpoint) as data: its images are the run's own grids and plots."""
    folder = Path(data).expanduser()
    marks = [folder / HISTORY, folder / GENERATOR / EXPORT_WEIGHTS,
             *([folder.parent.parent / HISTORY] if folder.parent.name == CHECKPOINTS else [])]
    if not folder.is_dir() or not any(mark.is_file() for mark in marks):
        return
    try:
        trained_on = f" ({DATA_RECORD} names {printable(str(read_json(folder / DATA_RECORD)['source']))})"
    except (OSError, ValueError, TypeError, KeyError, UnsafeFileError):  # only a detail of the message
        trained_on = ""
    raise DataError(f"{printable(str(data))} is a gan_accel run folder, not a folder of training images (its images "
                    f"are the run's sample grids and plots): pass the images the run trained on{trained_on}")


def scan_images(source: str | os.PathLike | Any, labels: str = "auto", *, split: str | None = None,
                image_column: str | None = None, label_column: str | None = None,
                cache_dir: str | os.PathLike | None = None, accelerator: Any = None,
                read_only: bool = False) -> ImageScan:
    """List ``source`` and scan every candidate's header, once (the scan is cached); the arguments are
    :func:`open_image_data`'s. ``read_only``: a cached scan is read when there is one, else the headers are read
    again, and nothing is written (``gan-accel train --dry-run``; :meth:`ImageScan.open` would write). Raises
    :class:`DataError` for a missing or empty source."""
    if labels not in LABEL_MODES:
        raise DataError(f"labels {labels!r} is unknown: choose {', '.join(LABEL_MODES)}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    if isinstance(source, (str, os.PathLike)):
        if not os.fspath(source).strip():
            raise DataError("the data path is empty: pass a folder of images, a .zip of them or hf:NAME ('.' for "
                            "the current folder)")
        check_outside_data(source, root, "the image cache", "pass --cache-dir (or set GAN_ACCEL_CACHE) outside it")
        check_not_a_run(source)
    src = resolve_source(source, split=split, image_column=image_column, label_column=label_column,
                         use_labels=labels != "none", accelerator=accelerator)
    entries = src.entries()
    if not entries:
        raise DataError(f"{src.description} holds no files (hidden files are ignored): pass the folder that holds "
                        "the images")
    key = image_cache.scan_key(src.identity(), entries)
    cache, builder = CacheFolder(root, key), builder_of(accelerator)
    if read_only:
        return ImageScan(src, entries, cache, key, cache.scan(src, entries, write=False), labels, accelerator, builder)
    build_once(accelerator, builder, "scan", lambda: cache.scan(src, entries), root)
    scan = cache.read_json(cache.scan_json)
    if scan is None:
        raise DataError(f"the scan of {src.description} is missing from {cache.path}: the data changed while it "
                        "was being read, or the cache was removed; start again")
    return ImageScan(src, entries, cache, key, scan, labels, accelerator, builder)


def open_image_data(source: str | os.PathLike | Any, resolution: int, channels: int | None = None,
                    crop: str = "center", labels: str = "auto", *, split: str | None = None,
                    image_column: str | None = None, label_column: str | None = None, background: str = "white",
                    cache_dir: str | os.PathLike | None = None, memory_budget: int | None = None,
                    batch_size: int | None = None, accelerator: Any = None, build_workers: int | None = None,
                    log: Callable[[str], Any] | None = print) -> ImageData:
    """Scan an image source, check it, decode it into the cache when it fits, and describe it.

    Args:
        source: a folder (recursive), a ``.zip``, ``"hf:NAME[:SPLIT]"`` (a Hub dataset), ``"hf:FOLDER[:SPLIT]"``
            (the ``imagefolder`` builder), or a ``datasets.Dataset`` / ``DatasetDict``.
        resolution, channels, crop, background: the :class:`~gan_accel.data.image_decode.Preprocessing`.
        labels: "auto" (classes when the source has them), "none", or "required" (none is a DataError).
        split, image_column, label_column: for Hugging Face datasets (default: the ``Image`` and
            ``ClassLabel`` columns).
        cache_dir: the cache root (default :func:`~gan_accel.data.image_cache.default_cache_root`).
        memory_budget: the largest uint8 array (bytes) cached; larger sets are decoded per item.
            Default: a quarter of the physical memory; 0: never cache.
        batch_size: when given, fewer images than one batch on every process is refused before decoding.
        accelerator: under ``accelerate launch``: one process per machine builds, the others wait.
        build_workers: processes decoding the cache build (default: the cores, at most 8, from 2,048 images).
        log: where the summary and the warning lines go (the main process only); None: silent.

    Raises:
        DataError: one line naming the problem and the fix.
    """
    prep = Preprocessing(resolution, channels, crop, background)  # bad settings: one line before any listing
    images = scan_images(source, labels, split=split, image_column=image_column, label_column=label_column,
                         cache_dir=cache_dir, accelerator=accelerator)
    return images.open(prep, batch_size=batch_size, memory_budget=memory_budget, build_workers=build_workers, log=log)
