"""open_image_data on Hugging Face datasets: an in-memory ``datasets.Dataset``, a DatasetDict, and the
``imagefolder`` builder on a local folder (``hf:FOLDER``). Needs the optional ``datasets`` package
(``pip install 'gan_accel[datasets]'``, part of the dev extra); without it only the one-line error is tested.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from gan_accel.data import open_image_data
from gan_accel.errors import DataError

R = 16


def _png(seed: int, size=(24, 18), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
    buffer = io.BytesIO()
    img.save(buffer, "PNG")
    return buffer.getvalue()


def _fit(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(ImageOps.fit(img.convert("RGB"), (R, R), Image.LANCZOS)).transpose(2, 0, 1)


def _rows(data) -> np.ndarray:
    ds = data.dataset()
    return np.stack([ds[i][0].numpy() for i in range(len(ds))])


def test_without_datasets_the_error_is_one_line_with_the_install_command(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DataError) as error:
        open_image_data("hf:some/dataset", R, cache_dir=tmp_path, log=None)
    assert "pip install 'gan_accel[datasets]'" in str(error.value) and "\n" not in str(error.value)


try:
    import datasets
except ImportError:
    datasets = None
# A mark, not a module-level importorskip: the test above runs without the package.
needs_datasets = pytest.mark.skipif(datasets is None, reason="the optional datasets package is not installed "
                                         "(pip install 'gan_accel[datasets]')")


def _dataset(n: int = 6, with_labels: bool = True, broken: int | None = None):
    images = [{"bytes": _png(i), "path": None} for i in range(n)]
    if broken is not None:
        images[broken] = {"bytes": b"not an image", "path": None}
    columns = {"picture": images, "caption": [f"image {i}" for i in range(n)]}
    features = {"picture": datasets.Image(), "caption": datasets.Value("string")}
    if with_labels:
        columns["kind"] = [i % 3 for i in range(n)]
        features["kind"] = datasets.ClassLabel(names=["ant", "bee", "cow"])
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features)), images


@needs_datasets
def test_in_memory_dataset_columns_found_by_feature_type(tmp_path: Path) -> None:
    ds, images = _dataset()
    data = open_image_data(ds, R, cache_dir=tmp_path, log=None)
    assert data.class_names == ["ant", "bee", "cow"] and data.labels.tolist() == [0, 1, 2, 0, 1, 2]
    assert data.report.classes == {"ant": 2, "bee": 2, "cow": 2}
    expected = np.stack([_fit(cell["bytes"]) for cell in images])
    assert np.array_equal(_rows(data), expected)
    x, y = next(iter(data.dataloader(6, shuffle=False)))
    assert x.shape == (6, 3, R, R) and y.tolist() == [0, 1, 2, 0, 1, 2]


@needs_datasets
def test_named_columns_and_plain_value_labels(tmp_path: Path) -> None:
    ds, _ = _dataset(with_labels=False)
    ds = ds.add_column("species", ["b", "a", "b", "c", "a", "a"])
    data = open_image_data(ds, R, cache_dir=tmp_path, log=None, image_column="picture", label_column="species")
    assert data.class_names == ["a", "b", "c"] and data.labels.tolist() == [1, 0, 1, 2, 0, 0]
    unlabelled = open_image_data(ds, R, cache_dir=tmp_path, log=None)
    assert unlabelled.labels is None and "class column" in unlabelled.report.no_labels_reason
    with pytest.raises(DataError, match="needs labels"):
        open_image_data(ds, R, cache_dir=tmp_path, log=None, labels="required")


@needs_datasets
@pytest.mark.parametrize("kwargs, words", [
    ({"image_column": "photo"}, "no column 'photo'"),
    ({"label_column": "nope"}, "no column 'nope'"),
    ({"image_column": "kind"}, "not images or image paths"),
])
def test_missing_or_wrong_columns_are_one_line(tmp_path: Path, kwargs: dict, words: str) -> None:
    ds, _ = _dataset()
    with pytest.raises(DataError, match=words) as error:
        open_image_data(ds, R, cache_dir=tmp_path, log=None, **kwargs)
    assert "\n" not in str(error.value)


@needs_datasets
def test_a_dataset_without_an_image_column_is_one_line(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"text": ["a", "b"]})
    with pytest.raises(DataError, match=r"has no image column \(its columns: text\).*--image-column"):
        open_image_data(ds, R, cache_dir=tmp_path, log=None)


@needs_datasets
def test_dataset_dict_split_and_unreadable_rows(tmp_path: Path) -> None:
    train, _ = _dataset(broken=2)
    test, _ = _dataset(n=3)
    both = datasets.DatasetDict({"train": train, "test": test})
    lines: list[str] = []
    data = open_image_data(both, R, cache_dir=tmp_path, log=lines.append)
    assert len(data) == 5 and [s.name for s in data.skipped_files] == ["row 2"]
    assert sum("warning: skipped 1 of 6" in line for line in lines) == 1
    assert len(open_image_data(both, R, split="test", cache_dir=tmp_path, log=None)) == 3
    with pytest.raises(DataError, match="has the splits a, b: choose one"):
        open_image_data(datasets.DatasetDict({"a": train, "b": test}), R, cache_dir=tmp_path, log=None)


@needs_datasets
def test_imagefolder_through_datasets_matches_the_folder_source(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")  # its arrow files go here
    root = tmp_path / "photos"
    for i in range(6):
        path = root / ("cats" if i < 3 else "dogs") / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_png(i))
    folder = open_image_data(root, R, cache_dir=tmp_path / "cache", log=None)
    hub = open_image_data(f"hf:{root}", R, cache_dir=tmp_path / "cache", log=None)
    assert hub.class_names == folder.class_names == ["cats", "dogs"]
    # imagefolder may list the files in its own order: compare (image, label) pairs as sets
    pairs = lambda d: sorted((row.tobytes(), int(label)) for row, label in zip(_rows(d), d.labels))  # noqa: E731
    assert pairs(hub) == pairs(folder)
