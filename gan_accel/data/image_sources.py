"""Where images come from: a folder (recursive), a ZIP archive, or a Hugging Face dataset.

A source lists its items cheaply (names, sizes, modification times: no file is opened), opens one item
for decoding, and says what identifies its content for the cache key. Listing is sorted, so every
process and every run sees the same order.

The class rule for folders and ZIPs (``labels="auto"``): single folders that hold everything are
stepped into (``photos.zip`` holding only ``photos/`` is read from ``photos/``); then, when every
readable image lies in a first-level subfolder and there are at least two such subfolders, the
subfolder names are the classes, sorted by name (as torchvision's ``ImageFolder`` sorts them).
Otherwise the data has no labels. Hidden files and folders (``.name``), ``__MACOSX`` and the
thumbnail caches of Windows are ignored without a word; every other file is a candidate image.

What is read is checked before it is opened (docs/own-images.md, "Bad files"): a folder's file must be a regular
file (no FIFO, device or socket), inside the folder (a link out of it is skipped), and at most
``MAX_FILE_BYTES``; a ZIP member is read alone, bounded by its declared size, and an archive whose members
declare more than ``MAX_FILE_BYTES`` or inflate more than ``MAX_RATIO`` times is refused as a ZIP bomb.
"""

from __future__ import annotations

import io
import os
import stat
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import DataError, GanAccelError
from ..storage.reading import RefusedFile, not_regular, open_checked

MAX_FILE_BYTES = 512 << 20  # the largest image file read (a 64-megapixel 16-bit RGB TIFF is 384 MiB)
MAX_RATIO = 100  # a ZIP member above BOMB_FLOOR bytes that inflates more than this is no image (zeros: ~1,000x)
BOMB_FLOOR = 16 << 20
IGNORED_NAMES = frozenset({"__MACOSX", "Thumbs.db", "desktop.ini", "ehthumbs.db"})
DATASETS_HINT = "pip install 'gan_accel[datasets]'"
DAMAGED_ZIP = "damaged ZIP entry"  # a member the archive's central directory lists, not where it says


@dataclass(frozen=True)
class Entry:
    """One candidate image: its name inside the source, its size and a change stamp (mtime in ns, or a CRC)."""

    name: str
    size: int
    stamp: int


def _ignored(part: str) -> bool:
    return part.startswith(".") or part in IGNORED_NAMES


def open_regular(path: str | os.PathLike, limit: int | None = None) -> IO[bytes]:
    """Open ``path`` for reading only when it is a regular file of at most ``limit`` bytes (default
    ``MAX_FILE_BYTES``); raises :class:`RefusedFile` otherwise. Checked before opening (a FIFO would block, a
    device may act on open) and again on the open handle (the file may have been swapped in between)."""
    return open_checked(path, MAX_FILE_BYTES if limit is None else limit, "an image file")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


class ImageSource:
    """Base class: ``entries()`` lists, ``open(name)`` gives what ``decode_image`` takes, ``identity()`` feeds
    the cache key; ``cells``, ``classes`` and ``damaged`` tell the scan how to read and label the entries. A new
    source is a subclass and one branch in :func:`resolve_source`: nothing else names a source's kind."""

    description = ""  # what the user passed, as every message names it
    damaged = ""  # the skip reason for an entry that cannot be reached (OSError): the container is damaged there

    def cells(self, entries: Sequence[Entry]) -> Iterator[Any]:
        """What the scan reads per entry, in order: None opens it by name (a batched reader gives the cells)."""
        return (None for _ in entries)

    def classes(self, names: Sequence[str]) -> tuple[list[int] | None, list[str] | None, str]:
        """The class of each of ``names`` (the images used) and the class names, or None, None and why
        there are none. Entries named by path take their classes from the first folder (module docstring)."""
        if not names:
            return None, None, "no images"
        parts = [name.split("/") for name in names]
        depth = 0
        # Step into a single folder that holds everything (a ZIP of one top folder, a dataset's "train/").
        while all(len(p) > depth + 1 for p in parts) and len({p[depth] for p in parts}) == 1:
            depth += 1
        root = "/".join(parts[0][:depth]) or "the top folder"
        if any(len(p) == depth + 1 for p in parts):
            return None, None, f"some images lie directly in {root}, not in class subfolders"
        class_of = [p[depth] for p in parts]
        class_names = sorted(set(class_of))
        if len(class_names) < 2:
            return None, None, f"{root} has only one subfolder with images"
        index = {name: i for i, name in enumerate(class_names)}
        return [index[c] for c in class_of], class_names, ""


class FolderSource(ImageSource):
    """Every non-hidden file under a folder, recursively (symbolic links inside the folder followed once)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.description = str(self.root)
        self._real_root = os.path.realpath(self.root)
        self._refused: dict[str, str] = {}  # name -> why it is skipped unopened (a FIFO, a link out, ...)

    def entries(self) -> list[Entry]:
        found: list[Entry] = []
        seen_dirs: set[str] = set()

        def refuse(name: str, reason: str) -> None:
            self._refused[name] = reason
            found.append(Entry(name, -1, 0))

        def walk(folder: str, prefix: str) -> None:
            real = os.path.realpath(folder)
            if real in seen_dirs:  # a link back up the tree
                return
            seen_dirs.add(real)
            with os.scandir(folder) as listing:
                items = sorted(listing, key=lambda e: e.name)
            for item in items:
                if _ignored(item.name):
                    continue
                name = prefix + item.name
                if item.is_symlink() and not _inside(os.path.realpath(item.path), self._real_root):
                    refuse(name, "a link out of the data folder: copy what it points to into the folder")
                    continue
                try:
                    info = item.stat()  # follows links
                except OSError:  # a dangling link: a file that cannot be read
                    found.append(Entry(name, -1, 0))
                    continue
                if stat.S_ISDIR(info.st_mode):
                    walk(item.path, f"{name}/")
                elif not_regular(info.st_mode):
                    refuse(name, not_regular(info.st_mode))
                else:
                    found.append(Entry(name, info.st_size, info.st_mtime_ns))

        walk(str(self.root), "")
        found.sort(key=lambda e: e.name)
        return found

    def open(self, name: str) -> IO[bytes]:
        if name in self._refused:
            raise RefusedFile(self._refused[name])
        path = os.path.realpath(self.root / name)
        if not _inside(path, self._real_root):  # a link changed since the listing
            raise RefusedFile("a link out of the data folder: copy what it points to into the folder")
        return open_regular(path)

    def identity(self) -> dict[str, Any]:
        return {"kind": "folder", "path": str(self.root.resolve())}


class ZipSource(ImageSource):
    """The files inside a ZIP archive (the same layout rules as a folder). Opened once per process."""

    damaged = DAMAGED_ZIP

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.description = str(self.path)
        self._handle: tuple[int, zipfile.ZipFile] | None = None
        try:
            with open_regular(self.path, limit=1 << 62) as handle, zipfile.ZipFile(handle) as archive:
                # A name stored twice (an archive appended to) is the last copy, as unzip extracts it: each
                # name is one image, not several reads of one member.
                latest = {i.filename: i for i in archive.infolist()}
                self._infos = [i for i in latest.values() if not i.is_dir() and
                               not any(_ignored(p) for p in i.filename.split("/") if p != "..")]
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError) as error:
            raise DataError(f"{self.path} is not a readable ZIP archive ({error}): pass a folder of images or "
                            "a .zip of them") from None
        for i in self._infos:  # from the central directory: nothing is inflated to find a bomb
            ratio = i.file_size / max(i.compress_size, 1)
            if i.file_size > MAX_FILE_BYTES or (i.file_size > BOMB_FLOOR and ratio > MAX_RATIO):
                raise DataError(
                    f"{self.path} looks like a ZIP bomb: its member {i.filename!r} declares {i.file_size:,} bytes from "
                    f"{i.compress_size:,} compressed ({ratio:,.0f}x; gan_accel reads members of at most "
                    f"{MAX_FILE_BYTES:,} bytes that inflate at most {MAX_RATIO}x beyond {BOMB_FLOOR:,}): remove it, "
                    "or unpack the archive yourself if you trust it and pass the folder")
        self._sizes = {i.filename: i.file_size for i in self._infos}
        info = self.path.stat()
        self._stamp = (info.st_size, info.st_mtime_ns)

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers open their own handle
        return {**self.__dict__, "_handle": None}

    def _archive(self) -> zipfile.ZipFile:
        # Keyed by process id: a handle inherited through fork shares its file offset with the parent.
        if self._handle is None or self._handle[0] != os.getpid():
            self._handle = (os.getpid(), zipfile.ZipFile(self.path))
        return self._handle[1]

    def entries(self) -> list[Entry]:
        return sorted((Entry(i.filename, i.file_size, i.CRC) for i in self._infos), key=lambda e: e.name)

    def open(self, name: str) -> IO[bytes]:
        # One member, read whole (a seekable file for Pillow) but never past its declared size, which the
        # constructor bounded; zipfile checks the CRC when the read reaches the end.
        if name.startswith("/") or ".." in name.split("/"):  # listed and skipped, never a path to follow
            raise RefusedFile("a member path out of the archive (absolute or '..'): unpack it yourself if you trust it")
        declared = self._sizes[name]
        with self._archive().open(name) as member:
            data = member.read(declared)
            if member.read(1):
                raise RefusedFile(f"holds more than the {declared:,} bytes its ZIP header declares")
        return io.BytesIO(data)

    def identity(self) -> dict[str, Any]:
        return {"kind": "zip", "path": str(self.path.resolve()), "size": self._stamp[0], "mtime_ns": self._stamp[1]}


class HFSource(ImageSource):
    """The rows of a Hugging Face ``datasets.Dataset``; its image column is read undecoded, as bytes or paths."""

    def __init__(self, dataset: Any, description: str, image_column: str | None = None,
                 label_column: str | None = None, use_labels: bool = True) -> None:
        datasets = import_datasets()
        features = dataset.features
        self.description = description
        self.image_column = _image_column(features, image_column, description)
        images = dataset.select_columns([self.image_column])
        if isinstance(features[self.image_column], datasets.Image):
            images = images.cast_column(self.image_column, datasets.Image(decode=False))
        self._images = images
        self._length = len(dataset)
        self.label_column = _label_column(features, label_column, description) if use_labels else None
        # the class column's (label per row, class names), or None
        self.labels = None if self.label_column is None else \
            _read_labels(dataset, self.label_column, features[self.label_column], datasets)
        self._fingerprint = dataset._fingerprint  # datasets' own hash of the data and its transforms

    def entries(self) -> list[Entry]:  # named "row 007": the row, zero-padded so that names sort as rows
        width = len(str(max(self._length - 1, 0)))
        return [Entry(f"row {i:0{width}d}", -1, 0) for i in range(self._length)]

    def open(self, name: str) -> Any:
        return self._images[int(name.split()[-1])][self.image_column]

    def cells(self, entries: Sequence[Entry]) -> Iterator[Any]:
        """Every image cell in order, read in batches (the scan's fast path)."""
        for batch in self._images.iter(batch_size=256):
            yield from batch[self.image_column]

    def classes(self, names: Sequence[str]) -> tuple[list[int] | None, list[str] | None, str]:
        """From the class column (row names carry no folder)."""
        if self.labels is None:
            return None, None, f"{self.description} has no class column (name one with --label-column)"
        ids, class_names = self.labels
        return [ids[int(name.split()[-1])] for name in names], class_names, ""

    def identity(self) -> dict[str, Any]:
        return {"kind": "hf", "fingerprint": self._fingerprint, "rows": self._length,
                "image_column": self.image_column, "label_column": self.label_column}


def import_datasets() -> Any:
    """The ``datasets`` package, or one line saying how to install it."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"reading a Hugging Face dataset needs the datasets package: {DATASETS_HINT}") from None
    return datasets


def _check_named(features: Any, named: str, description: str, what: str, flag: str) -> None:
    if named not in features:
        raise DataError(f"{description} has no column {named!r} (its columns: {', '.join(features)}): "
                        f"name its {what} column with {flag}")


def _image_column(features: Any, named: str | None, description: str) -> str:
    import datasets

    if named is not None:
        _check_named(features, named, description, "image", "--image-column")
        feature = features[named]
        if not isinstance(feature, datasets.Image) and getattr(feature, "dtype", None) != "string":
            raise DataError(f"column {named!r} of {description} holds {feature}, not images or image paths: "
                            "name its image column with --image-column")
        return named
    found = [name for name, feature in features.items() if isinstance(feature, datasets.Image)]
    if not found:
        raise DataError(f"{description} has no image column (its columns: {', '.join(features)}): name the column "
                        "that holds images or image paths with --image-column")
    if len(found) > 1:
        raise DataError(f"{description} has several image columns ({', '.join(found)}): choose one with --image-column")
    return found[0]


def _label_column(features: Any, named: str | None, description: str) -> str | None:
    import datasets

    if named is not None:
        _check_named(features, named, description, "class", "--label-column")
        return named
    found = [name for name, feature in features.items() if isinstance(feature, datasets.ClassLabel)]
    if len(found) > 1:
        preferred = [name for name in found if name in ("label", "labels")]
        if len(preferred) != 1:
            raise DataError(f"{description} has several class columns ({', '.join(found)}): choose one with "
                            "--label-column")
        found = preferred
    return found[0] if found else None


def _read_labels(dataset: Any, column: str, feature: Any, datasets: Any) -> tuple[list[int], list[str]]:
    values = list(dataset.select_columns([column])[column])
    if isinstance(feature, datasets.ClassLabel):
        names = list(feature.names)
        if any(v is None or not 0 <= int(v) < len(names) for v in values):
            raise DataError(f"column {column!r} has rows without a class (-1 or empty): remove them or choose "
                            "another --label-column")
        return [int(v) for v in values], names
    if any(v is None or isinstance(v, (list, dict, float)) for v in values):
        raise DataError(f"column {column!r} does not hold one class per row (it holds {feature}): name a class "
                        "column with --label-column")
    # Plain integers or strings: the classes are the distinct values, sorted (numbers by value).
    distinct = sorted(set(values))
    index = {value: i for i, value in enumerate(distinct)}
    return [index[v] for v in values], [str(v) for v in distinct]


def load_hf(spec: str, split: str | None) -> tuple[Any, str]:
    """``hf:NAME[:SPLIT]`` (a Hub dataset) or ``hf:FOLDER[:SPLIT]`` (the ``imagefolder`` builder)."""
    datasets = import_datasets()
    name = spec[len("hf:"):]
    if ":" in name:
        head, tail = name.rsplit(":", 1)
        if tail and "/" not in tail and "\\" not in tail:
            name, split = head, split or tail
    if not name:
        raise DataError(f"{spec!r} names no dataset: write hf:NAME[:SPLIT] (a Hub dataset) or hf:FOLDER[:SPLIT]")
    try:
        if os.path.isdir(name):
            loaded = datasets.load_dataset("imagefolder", data_dir=name, split=split)
            description = f"imagefolder {name}"
        else:
            loaded = datasets.load_dataset(name, split=split)
            description = f"Hugging Face dataset {name}"
    except Exception as error:  # network, unknown name or split, a malformed folder: all the user's input
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(f"could not load the Hugging Face dataset {name!r} (split {split or 'all'}): "
                        f"{type(error).__name__}: {first}") from None
    return loaded, description + (f" [{split}]" if split else "")


def pick_split(dataset: Any, split: str | None, description: str) -> tuple[Any, str]:
    """A ``Dataset`` from a ``DatasetDict``: the named split, else "train", else the only one."""
    datasets = import_datasets()
    if not isinstance(dataset, (datasets.DatasetDict, dict)):
        if isinstance(dataset, datasets.IterableDataset) or not isinstance(dataset, datasets.Dataset):
            raise DataError(f"{description} is a {type(dataset).__name__}: pass a datasets.Dataset or DatasetDict "
                            "(a streaming IterableDataset cannot be scanned before training)")
        return dataset, description
    splits = list(dataset)
    chosen = split or ("train" if "train" in splits else (splits[0] if len(splits) == 1 else None))
    if chosen not in splits:
        raise DataError(f"{description} has the splits {', '.join(splits)}: choose one (hf:NAME:SPLIT or split=...)")
    return pick_split(dataset[chosen], None, f"{description} [{chosen}]")


def resolve_source(source: Any, *, split: str | None = None, image_column: str | None = None,
                   label_column: str | None = None, use_labels: bool = True, accelerator: Any = None) -> ImageSource:
    """A folder, a ``.zip``, ``hf:NAME[:SPLIT]`` / ``hf:FOLDER[:SPLIT]``, or a ``datasets`` object, as a source."""
    if not isinstance(source, (str, os.PathLike)):
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
            from ..processes import raise_together

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
    kind = not_regular(path.stat().st_mode)
    if kind:  # opening a FIFO would wait forever, a device may act on being opened
        raise DataError(f"{path} is {kind.split(': ')[-1]}, not a folder of images or a .zip: pass the folder that "
                        "holds the images")
    try:
        is_zip = path.suffix.lower() == ".zip" or zipfile.is_zipfile(path)
    except OSError:
        is_zip = False
    if is_zip:
        return ZipSource(path)
    raise DataError(f"{path} is a file, not a folder of images or a .zip: pass the folder that holds the images")
