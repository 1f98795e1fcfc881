"""Images for the open_image_data tests (tests/test_image_data.py, tests/test_image_data_cache.py), and Pillow's
own decode of them.

Smooth random patterns saved in any format, labelled folders, Pillow's ``ImageOps.fit`` as the expected
decode, the rows of an opened set, and ``_open`` with a per-test cache folder (the ``cache`` fixture).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from gan_accel.data import image_decode, open_image_data

R = 16


def _pattern(width: int, height: int, seed: int, channels: int = 3) -> np.ndarray:
    """A smooth random image (low-frequency noise upsampled), so resampling differences are visible but small."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (4, 4, channels), dtype=np.uint8)
    mode = "RGB" if channels == 3 else ("RGBA" if channels == 4 else "L")
    img = Image.fromarray(small.squeeze(-1) if channels == 1 else small, mode).resize((width, height), Image.BICUBIC)
    array = np.asarray(img)
    return array + rng.integers(0, 8, array.shape, dtype=np.uint8)  # fine detail as well


def _save(path: Path, img: Image.Image, fmt: str | None = None, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format=fmt, **kwargs)
    return path


def _fit(img: Image.Image) -> np.ndarray:
    """Pillow's own 'resize the short side to R, crop the centre', as (C, R, R) uint8."""
    array = np.asarray(ImageOps.fit(img, (R, R), Image.LANCZOS))
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _decode(path: Path, channels: int, **kwargs) -> np.ndarray:
    return image_decode.decode_image(path, image_decode.Preprocessing(R, channels, **kwargs))


def _rows(data) -> np.ndarray:
    """Every image of an ImageData as uint8 (N, C, R, R), in order, straight from its dataset."""
    ds = data.dataset()
    return np.stack([ds[i][0].numpy() for i in range(len(ds))])


def _labelled_folder(root: Path, per_class: int = 3, classes=("cats", "dogs"), size=(24, 18)) -> Path:
    for c, name in enumerate(classes):
        for i in range(per_class):
            _save(root / name / f"{i}.png", Image.fromarray(_pattern(*size, seed=10 * c + i)))
    return root


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _open(source, cache: Path, **kwargs):
    lines: list[str] = []
    kwargs.setdefault("resolution", R)
    data = open_image_data(source, cache_dir=cache, log=lines.append, **kwargs)
    data.log_lines = lines  # for the tests that read what was said
    return data


def _broken_png(path: Path) -> Path:
    """A PNG whose header and end marker are intact but whose pixel data is garbage: only a decode finds it."""
    buffer = io.BytesIO()
    Image.fromarray(_pattern(20, 20, 42)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    start = data.index(b"IDAT") + 8
    data[start:start + 40] = bytes(40)
    path.write_bytes(bytes(data))
    return path
