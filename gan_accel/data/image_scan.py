"""The scan: which candidate files are readable images, what they are, and what will be trained on (with labels).

The scan opens every candidate's header and, for PNG, JPEG and WebP, checks its end marker (a file
cut short lacks it); it decodes nothing. A file that is not an image, cannot be read or is truncated
is skipped and listed with its reason. The full decode (when the cache is built, or per item in the
DataLoader workers) skips and counts whatever else is broken.
"""

from __future__ import annotations

import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..text import printable
from .image_decode import TooManyPixels, mode_family, read_header
from .image_sources import DAMAGED_ZIP, Entry, ImageSource, RefusedFile

SHOWN_NAMES = 5  # names in the one warning line; the rest are in the full list


@dataclass(frozen=True)
class SkippedFile:
    """A candidate that is not used, and why ("not an image", "truncated or corrupt: ...", ...)."""

    name: str
    reason: str


@dataclass
class ScanReport:
    """What a scan found: the readable images, the sizes and colour modes seen, the classes, the skipped files.

    ``count`` is the number of images training will use (the cache build may lower it further when a
    file that passed the scan fails to decode: then ``skipped`` lists it too).
    """

    source: str
    files: int  # candidate files listed (hidden files and OS clutter not counted)
    count: int  # readable images
    sizes: dict[str, Any]  # {"min": [w, h], "max": [w, h], "common": [[w, h, n], ...]}
    modes: dict[str, int]  # colour mode family -> images
    grey: bool  # every image is grayscale (a grey palette counts)
    classes: dict[str, int] | None  # class name -> images, None without labels
    no_labels_reason: str = ""  # why the data has no labels (the class rule did not apply)
    skipped: list[SkippedFile] = field(default_factory=list)

    def summary(self) -> str:
        """One line: count, sizes, modes and classes."""
        sizes = self.sizes
        if self.count:
            common = ", ".join(f"{w}x{h} ({n:,})" for w, h, n in sizes["common"][:3])
            if sizes["min"] == sizes["max"]:
                size_text = f"all {sizes['min'][0]}x{sizes['min'][1]}"
            else:
                size_text = (f"sizes {sizes['min'][0]}x{sizes['min'][1]} to {sizes['max'][0]}x{sizes['max'][1]}, "
                             f"most often {common}")
        else:
            size_text = "no sizes"
        modes = ", ".join(f"{name} {n:,}" for name, n in sorted(self.modes.items(), key=lambda kv: -kv[1]))
        if self.classes:
            shown = list(self.classes.items())
            classes = ", ".join(f"{name} ({n:,})" for name, n in shown[:10])
            more = f", ... ({len(shown) - 10} more)" if len(shown) > 10 else ""
            class_text = f"{len(shown)} classes: {classes}{more}"
        else:
            class_text = "no labels" + (f" ({self.no_labels_reason})" if self.no_labels_reason else "")
        return f"{self.count:,} images in {self.source}; {size_text}; {modes}; {class_text}"

    def skipped_warning(self, where: str) -> str | None:
        """The one warning line about skipped files (the full list is in ``where``), or None when none was skipped."""
        if not self.skipped:
            return None
        kinds = Counter(s.reason.split(":")[0] for s in self.skipped)
        kind_text = ", ".join(f"{n:,} {kind}" for kind, n in kinds.most_common())
        names = ", ".join(s.name for s in self.skipped[:SHOWN_NAMES])
        more = ", ..." if len(self.skipped) > SHOWN_NAMES else ""
        return (f"gan_accel: warning: skipped {len(self.skipped):,} of {self.files:,} files that are not readable "
                f"images ({kind_text}): {names}{more}; the full list is in {where}")


def skip_reason(error: BaseException) -> str:
    """A short reason for a file that failed to open or decode."""
    if isinstance(error, (RefusedFile, TooManyPixels)):
        return str(error)
    if isinstance(error, UnidentifiedImageError):
        return "not an image"
    if isinstance(error, FileNotFoundError):
        return "missing"
    if isinstance(error, PermissionError):
        return "unreadable: permission denied"
    if isinstance(error, zipfile.BadZipFile):
        return f"{DAMAGED_ZIP}: {error}"
    if isinstance(error, Image.DecompressionBombError):
        return "too large: more pixels than Pillow's decompression-bomb limit"
    if isinstance(error, OSError) and error.errno is not None:  # the system's (a link loop, an I/O error), not Pillow's
        return f"unreadable: {error.strerror}"
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"truncated or corrupt: {text}"


def scan(source: ImageSource, entries: list[Entry]) -> tuple[list[tuple[int, int, int, str, bool]], list[SkippedFile]]:
    """Read every candidate's header (no decoding; see the module docstring): per readable image its entry
    index, header (width, height, mode) and whether it is grey; and the skipped files."""
    items: list[tuple[int, int, int, str, bool]] = []
    skipped: list[SkippedFile] = []
    for index, (entry, cell) in enumerate(zip(entries, source.cells(entries))):
        if entry.size == 0:
            skipped.append(SkippedFile(entry.name, "not an image: empty file"))
            continue
        try:
            opened = cell if cell is not None else source.open(entry.name)
        except MemoryError:
            raise
        except Exception as error:  # an entry the source lists but cannot reach: a ZIP is damaged there
            damaged = isinstance(error, (OSError, EOFError)) and not isinstance(error, RefusedFile) and source.damaged
            skipped.append(SkippedFile(entry.name, f"{source.damaged}: {error}" if damaged else skip_reason(error)))
            continue
        try:
            (width, height, mode), grey = read_header(opened)
        except MemoryError:
            raise
        except Exception as error:  # Pillow raises many types for broken files; each means "skip this file"
            skipped.append(SkippedFile(entry.name, skip_reason(error)))
            continue
        items.append((index, width, height, mode, grey))
    return items, skipped


def size_summary(items: list[tuple[int, int, int, str, bool]]) -> dict[str, Any]:
    """Smallest and largest (by area) and the most common sizes."""
    if not items:
        return {"min": [0, 0], "max": [0, 0], "common": []}
    sizes = Counter((w, h) for _, w, h, _, _ in items)
    smallest = min(sizes, key=lambda s: (s[0] * s[1], s))
    largest = max(sizes, key=lambda s: (s[0] * s[1], s))
    return {"min": list(smallest), "max": list(largest), "common": [[w, h, n] for (w, h), n in sizes.most_common(5)]}


def skipped_text(skipped: Sequence[SkippedFile]) -> str:
    """The full list of skipped files: one "name<TAB>reason" line each, escaped (a tab or newline in a name
    cannot forge a line or a column)."""
    return "".join(f"{printable(s.name)}\t{printable(s.reason)}\n" for s in skipped)


@dataclass
class Selection:
    """The images trained on, chosen from a scan: their entry positions, labels and the report."""

    report: ScanReport
    positions: list[int]  # entry index of each image used
    labels: np.ndarray | None  # int64 (N,), None without labels
    class_names: list[str] | None
    upscaled: int  # images whose short side is below the resolution


def select(scan_data: dict[str, Any], source: ImageSource, names: list[str], labels_mode: str, resolution: int,
           failed: Sequence[Sequence[str]] = ()) -> Selection:
    """From the scan (and the cache build's failures): the images used, their labels, and the report."""
    items = [tuple(item) for item in scan_data["items"]]
    skipped = [SkippedFile(*s) for s in scan_data["skipped"]]
    positions = [item[0] for item in items]
    label_ids, class_names, reason = (None, None, "") if labels_mode == "none" else \
        source.classes([names[p] for p in positions])
    failed_names = {name for name, _ in failed}
    if failed_names:
        keep = [i for i, p in enumerate(positions) if names[p] not in failed_names]
        items = [items[i] for i in keep]
        positions = [positions[i] for i in keep]
        label_ids = None if label_ids is None else [label_ids[i] for i in keep]
        skipped = skipped + [SkippedFile(name, why) for name, why in failed]
    classes = None
    if label_ids is not None:  # set with class_names
        counts = np.bincount(np.asarray(label_ids, dtype=np.int64), minlength=len(class_names))
        classes = {name: int(n) for name, n in zip(class_names, counts)}
    modes = Counter(mode_family(mode, grey) for _, _, _, mode, grey in items)
    report = ScanReport(
        source=source.description, files=len(names), count=len(items), sizes=size_summary(items), modes=dict(modes),
        grey=bool(items) and all(item[4] for item in items), classes=classes,
        no_labels_reason="" if classes else (reason or ("labels='none'" if labels_mode == "none" else "")),
        skipped=skipped,
    )
    labels = None if label_ids is None else np.asarray(label_ids, dtype=np.int64)
    upscaled = sum(1 for _, w, h, _, _ in items if min(w, h) < resolution)
    return Selection(report, positions, labels, class_names, upscaled)
