"""Decoding one image file into a square uint8 array, and the cheap checks a scan makes before decoding.

One policy for every source (folder, ZIP, Hugging Face dataset), all in Pillow (docs/own-images.md):

* formats: PNG, JPEG (and MPO), WebP, BMP, GIF (first frame), TIFF. No other Pillow plugin: some run
  external programs (EPS runs Ghostscript), and nothing the project loads may execute code.
* EXIF orientation is applied; transparency is flattened onto a background, white by default (the colour
  under fully transparent pixels is arbitrary, and transparent graphics are made for a light page).
* 16- and 32-bit grey are scaled to 0..255 (float grey whose values all lie in 0..1 too); other modes go
  through Pillow's conversions.
* ``crop="center"``: the central square resized to R x R in one Lanczos resample (:func:`PIL.ImageOps.fit`'s
  maths); ``crop="random"``: short side R, long side kept up to ``RANDOM_CROP_MAX_ASPECT`` x R, the window
  chosen per draw (:mod:`gan_accel.data.loader`).
* images of more than ``MAX_PIXELS`` pixels (by their header) are refused before any pixel is decoded, in
  gan_accel's own words (Pillow's DecompressionBombWarning is silenced: the check comes first).
* JPEG is decoded at 1/2, 1/4 or 1/8 scale while that keeps >= 2R pixels on the short side: a large
  photo costs a fraction of its full decode, and the Lanczos resample from >= 2R keeps the quality.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import struct
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PIL import Image, ImageOps

# The plugins of ALLOWED_FORMATS, registered by importing them (Image.open(formats=...) needs them loaded;
# Image.init() would load every plugin, those that run external programs included).
from PIL import (BmpImagePlugin, GifImagePlugin, JpegImagePlugin, PngImagePlugin, TiffImagePlugin,  # noqa: F401
                 WebPImagePlugin)

from ..errors import DataError

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")  # JPEG also opens MPO files
CROPS = ("center", "random")
BACKGROUNDS = {"white": 255, "black": 0}
RANDOM_CROP_MAX_ASPECT = 1.5
GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_TAIL = 4096  # bytes read from the end of a file to find its format's end marker
MIN_RESOLUTION, MAX_RESOLUTION = 8, 4096
MAX_PIXELS = 64_000_000  # an 8000 x 8000 image; a 61-megapixel camera's 9504 x 6336 fits


class TooManyPixels(ValueError):
    """An image whose header declares more than ``MAX_PIXELS`` pixels: skipped before it is decoded."""


@contextlib.contextmanager
def open_image(item: Any) -> Iterator[Image.Image]:
    """The image of ``item`` (anything :func:`as_file` takes), opened with the allowed formats only and its size
    checked against ``MAX_PIXELS`` before anything is decoded; the file is closed on exit."""
    with contextlib.ExitStack() as stack:
        fp = as_file(item)
        if hasattr(fp, "close"):
            stack.callback(fp.close)  # Pillow leaves files it was handed open
        with warnings.catch_warnings():  # gan_accel's own limit below is lower, and says it in its words
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            try:
                img = stack.enter_context(Image.open(fp, formats=ALLOWED_FORMATS))
            except Image.DecompressionBombError:  # Pillow's own hard limit, above ours
                img = None
        size = "its header declares" if img is None else f"{img.width}x{img.height} pixels,"
        if img is None or img.width * img.height > MAX_PIXELS:
            raise TooManyPixels(f"too large: {size} more than the {MAX_PIXELS:,} pixels gan_accel decodes; shrink it")
        yield img


@dataclass(frozen=True)
class Preprocessing:
    """How every image becomes a square uint8 array: side R (8 to 4096), 1 or 3 channels (None: 1 when every
    image is grey, else 3, settled by :meth:`for_data`), crop "center" or "random", background "white" or
    "black" (what transparent pixels become). Invalid settings are one :class:`DataError` line."""

    resolution: int
    channels: int | None = None
    crop: str = "center"
    background: str = "white"

    def __post_init__(self) -> None:
        r = self.resolution
        if isinstance(r, bool) or not isinstance(r, int) or not MIN_RESOLUTION <= r <= MAX_RESOLUTION:
            raise DataError(f"resolution {r!r} cannot be used: choose a whole number of pixels from "
                            f"{MIN_RESOLUTION} to {MAX_RESOLUTION} (one the model can make)")
        if self.channels not in (None, 1, 3):
            raise DataError(f"channels {self.channels!r} cannot be used: choose 1 (grayscale) or 3 (RGB), or leave "
                            "it out to use what the data has")
        if self.crop not in CROPS:
            raise DataError(f"crop {self.crop!r} is unknown: choose {' or '.join(CROPS)}")
        if self.background not in BACKGROUNDS:
            raise DataError(f"background {self.background!r} is unknown: choose {' or '.join(BACKGROUNDS)}")

    def for_data(self, grey: bool) -> "Preprocessing":
        """The channels settled: the given ones, else 1 when every image is grey, else 3."""
        return self if self.channels is not None else replace(self, channels=1 if grey else 3)

    @property
    def name(self) -> str:
        """The name of this preprocessing's cache files, e.g. ``64px-3ch-center-white``."""
        return f"{self.resolution}px-{self.channels}ch-{self.crop}-{self.background}"

    @property
    def width(self) -> int:
        """The stored width: R for a centre crop, the longest strip for a random crop."""
        return self.resolution if self.crop == "center" else math.floor(self.resolution * RANDOM_CROP_MAX_ASPECT)

    def bytes_for(self, count: int) -> int:
        """The size of ``count`` decoded images (channels settled)."""
        return count * (self.channels or 3) * self.resolution * self.width


def is_grey(img: Image.Image) -> bool:
    """Whether the image has no colour: a grey mode, or a palette whose entries are all grey."""
    if img.mode in GREY_MODES:
        return True
    if img.mode in ("P", "PA"):
        palette = img.getpalette() or []
        return all(palette[i] == palette[i + 1] == palette[i + 2] for i in range(0, len(palette) - 2, 3))
    return False


_FAMILIES = {"1": "grayscale", "L": "grayscale", "LA": "grayscale+alpha", "La": "grayscale+alpha",
             "I": "32-bit grayscale", "F": "32-bit grayscale", "RGBA": "RGBA", "RGBa": "RGBA", "RGBX": "RGB"}


def mode_family(mode: str, grey: bool = False) -> str:
    """What a scan reports for a Pillow mode: "grayscale", "RGB", "RGBA", "palette", "16-bit grayscale", "CMYK", ..."""
    if mode in ("P", "PA"):
        return "palette (grey)" if grey else "palette"
    return "16-bit grayscale" if mode.startswith("I;16") else _FAMILIES.get(mode, mode)


def read_header(item: Any) -> tuple[tuple[int, int, str], bool]:
    """(width, height, mode) from an image's header (width and height swapped by an EXIF rotation where cheap
    to read) and whether it has no colour; raises for a non-image or a truncated file.

    Reads the header and, for PNG, JPEG and WebP, the end of the file: a file cut short (an interrupted
    copy or download) lacks its format's end marker. Nothing is decoded; a full decode (the cache build)
    finds the rest.
    """
    with open_image(item) as img:
        width, height = img.size
        if img.format in ("JPEG", "MPO", "WEBP", "TIFF"):
            # Orientations 5-8 turn the picture by 90 degrees. PNG is left out: its EXIF may follow the
            # pixel data, and reading it would decode the whole file.
            if img.getexif().get(0x0112, 1) in (5, 6, 7, 8):
                width, height = height, width
        check_complete(img)
        return (width, height, img.mode), is_grey(img)


def check_complete(img: Image.Image) -> None:
    """Raise ``OSError`` when a PNG, JPEG or WebP file lacks its end marker (it was cut short)."""
    fp = img.fp
    if fp is None or img.format not in ("PNG", "JPEG", "MPO", "WEBP"):
        return
    position = fp.tell()
    try:
        fp.seek(0, os.SEEK_END)
        size = fp.tell()
        if img.format == "WEBP":
            fp.seek(0)
            head = fp.read(12)
            declared = struct.unpack("<I", head[4:8])[0] + 8 if len(head) >= 8 else 0
            if size < declared:
                raise OSError(f"truncated WebP file ({size} of {declared} bytes)")
            return
        fp.seek(max(0, size - _TAIL))
        tail = fp.read(_TAIL)
    finally:
        fp.seek(position)
    # JPEG: the end-of-image marker FF D9 cannot occur inside entropy-coded data (an FF there is always
    # followed by 00 or a restart marker), so a file cut short has none in its last bytes. PNG: the IEND
    # chunk with its fixed CRC. Trailing bytes after the marker are tolerated, as decoders do.
    marker = b"IEND\xaeB`\x82" if img.format == "PNG" else b"\xff\xd9"
    if marker not in tail:
        raise OSError(f"truncated {img.format} file (no end marker)")


def _flatten(img: Image.Image, background: int) -> Image.Image:
    """Composite an image with alpha onto a uniform background: out = src * a + bg * (1 - a)."""
    grey = img.mode in ("LA", "La")
    base = Image.new("L" if grey else "RGB", img.size, background if grey else (background,) * 3)
    img = img.convert("LA" if grey else "RGBA")  # un-premultiplies La/RGBa
    base.paste(img.convert("L" if grey else "RGB"), mask=img.getchannel("A"))
    return base


def _high_bit_depth_to_l(img: Image.Image) -> Image.Image:
    array = np.asarray(img)
    if img.mode == "F":  # float pixels in 0..1 (as scientific and HDR tools write them) or 0..255
        array = np.nan_to_num(array)
        array = np.clip(array * (255 if array.max(initial=0) <= 1 else 1), 0, 255).round()
    else:  # I;16* and I: 0..65535 -> 0..255, rounded
        array = (np.clip(array.astype(np.int64), 0, 65535) * 255 + 32767) // 65535
    return Image.fromarray(array.astype(np.uint8), mode="L")


def to_working_mode(img: Image.Image, channels: int, background: int) -> Image.Image:
    """The image as "L" (grey sources, or ``channels == 1``) or "RGB", transparency flattened.

    Grey sources stay "L" even for 3 channels: resizing one channel and repeating it afterwards gives
    the same bytes as converting to RGB first, for a third of the work.
    """
    mode = img.mode
    if mode in ("P", "PA"):
        has_alpha = mode == "PA" or "transparency" in img.info
        img = img.convert("RGBA" if has_alpha else "RGB")
        mode = img.mode
    if mode == "1":
        img = img.convert("L")
    elif mode.startswith("I") or mode == "F":
        img = _high_bit_depth_to_l(img)
    elif mode in _ALPHA_MODES:
        img = _flatten(img, background)
    elif mode not in ("L", "RGB"):
        img = img.convert("RGB")  # RGBX, CMYK, YCbCr, LAB, HSV
    if channels == 1 and img.mode == "RGB":
        img = img.convert("L")
    return img


def strip_size(width: int, height: int, resolution: int) -> tuple[tuple[float, float, float, float], int]:
    """For ``crop="random"``: the source box and the long side of the strip (short side = resolution).

    The strip keeps the image's aspect up to :data:`RANDOM_CROP_MAX_ASPECT`; a longer image loses
    equal parts of both ends first.
    """
    short, long_ = min(width, height), max(width, height)
    kept = min(long_, short * RANDOM_CROP_MAX_ASPECT)
    length = max(resolution, min(round(resolution * kept / short), math.floor(resolution * RANDOM_CROP_MAX_ASPECT)))
    cut = (long_ - kept) / 2
    box = (cut, 0.0, cut + kept, float(height)) if width >= height else (0.0, cut, float(width), cut + kept)
    return box, length


def decode_image(item: Any, prep: Preprocessing) -> np.ndarray:
    """Decode one image (anything :func:`as_file` takes) to uint8 (channels, H, W): (channels, R, R) for
    ``crop="center"``.

    For ``crop="random"``: the image with its short side R and its long side up to 1.5 R, in its
    own orientation (the R x R window is chosen later, per draw).
    Raises Pillow's errors (``OSError``, ``ValueError``, ...) for an unreadable file.
    """
    resolution, channels = prep.resolution, prep.channels or 3
    with open_image(item) as img:
        scale = 2 * resolution / min(img.size)
        if img.format in ("JPEG", "MPO") and scale < 1:  # libjpeg decodes at the smallest 1/2^k scale >= 2R
            img.draft(img.mode, (math.ceil(img.width * scale), math.ceil(img.height * scale)))
        img = ImageOps.exif_transpose(img)  # loads the pixels
        img = to_working_mode(img, channels, BACKGROUNDS[prep.background])
        width, height = img.size
        if prep.crop == "center":  # the central square as the resize box (fractional when the excess is odd)
            side = min(width, height)
            left, top = (width - side) / 2, (height - side) / 2
            img = img.resize((resolution, resolution), Image.LANCZOS, box=(left, top, left + side, top + side))
        else:
            box, length = strip_size(width, height, resolution)
            size = (resolution, length) if height > width else (length, resolution)
            img = img.resize(size, Image.LANCZOS, box=box)
        array = np.asarray(img)
    array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
    if array.shape[0] != channels:
        array = np.repeat(array, channels, axis=0)
    return np.ascontiguousarray(array)


def as_file(item: Any) -> Any:
    """A file for Pillow from a path (a regular file, bounded in size: :func:`~gan_accel.data.image_sources.open_regular`),
    a file, bytes, or a Hugging Face image cell ``{"bytes", "path"}``."""
    if isinstance(item, dict):
        item = item.get("bytes") or item.get("path")
    if isinstance(item, (bytes, bytearray, memoryview)):
        item = io.BytesIO(item)
    if isinstance(item, (str, os.PathLike)):
        from .image_sources import open_regular

        item = open_regular(item)
    if item is None:
        raise ValueError("empty image cell")
    return item
