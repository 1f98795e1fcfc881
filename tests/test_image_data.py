"""Tests for gan_accel.data.open_image_data: decoding against Pillow's own, sources, class rule, bad files, errors.

Every expected image is computed independently with Pillow (``ImageOps.fit``: resize the short side
and crop the centre in one resample; conversions and alpha blending written out here), never hard-coded.
The images and Pillow's expected decode come from tests/image_files.py; the cache, the batches and two
processes are in tests/test_image_data_cache.py.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from gan_accel.data import image_decode
from gan_accel.errors import DataError, GanAccelError
from image_files import R, _broken_png, _decode, _fit, _labelled_folder, _open, _pattern, _rows, _save
from image_files import cache  # noqa: F401 (the fixture)


# ---------------------------------------------------------------------------------------------------
# Decoding: every format and colour mode, against Pillow's own decode + fit
# ---------------------------------------------------------------------------------------------------

FORMATS = [("png", "PNG"), ("jpg", "JPEG"), ("webp", "WEBP"), ("bmp", "BMP"), ("tif", "TIFF"), ("gif", "GIF")]


@pytest.mark.parametrize("ext, fmt", FORMATS)
@pytest.mark.parametrize("channels", [1, 3])
def test_every_format_decodes_as_pillow_fits_it(tmp_path: Path, ext: str, fmt: str, channels: int) -> None:
    kwargs = {"lossless": True} if fmt == "WEBP" else {}
    path = _save(tmp_path / f"a.{ext}", Image.fromarray(_pattern(37, 23, seed=1)), fmt, **kwargs)
    with Image.open(path) as img:
        expected = _fit(img.convert("RGB" if channels == 3 else "L"))
    assert np.array_equal(_decode(path, channels), expected)


@pytest.mark.parametrize("mode", ["L", "1", "P", "CMYK", "YCbCr"])
@pytest.mark.parametrize("channels", [1, 3])
def test_colour_modes_become_the_target_channels_as_pillow_converts_them(tmp_path: Path, mode: str,
                                                                          channels: int) -> None:
    img = Image.fromarray(_pattern(30, 41, seed=2)).convert(mode)
    fmt = "JPEG" if mode in ("CMYK", "YCbCr") else "PNG"
    path = _save(tmp_path / f"a.{fmt.lower()}", img, fmt)
    with Image.open(path) as stored:
        if channels == 3:
            expected = _fit(stored.convert("RGB"))
        else:
            # Pillow's own route to grey for each mode: colour modes through RGB, palette through RGB
            expected = _fit(stored.convert("L") if stored.mode in ("L", "1") else stored.convert("RGB").convert("L"))
    assert np.array_equal(_decode(path, channels), expected)


@pytest.mark.parametrize("background", ["white", "black"])
@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_transparency_is_flattened_onto_the_background(tmp_path: Path, mode: str, background: str) -> None:
    rgba = _pattern(33, 20, seed=3, channels=4)
    rgba[:5, :, 3] = 0  # a fully transparent band whose colour must not show
    if mode == "P":  # a palette image with one transparent index
        img = Image.fromarray(rgba[..., :3]).quantize(16)
        img.info["transparency"] = 0
        path = _save(tmp_path / "a.png", img, "PNG", transparency=0)
        with Image.open(path) as stored:
            as_rgba = np.asarray(stored.convert("RGBA")).astype(np.float64)
    else:
        img = Image.fromarray(rgba, "RGBA").convert(mode)
        path = _save(tmp_path / "a.png", img, "PNG")
        with Image.open(path) as stored:
            as_rgba = np.asarray(stored.convert("RGBA")).astype(np.float64)
    bg = 255.0 if background == "white" else 0.0
    alpha = as_rgba[..., 3:] / 255
    flat = np.clip(np.round(as_rgba[..., :3] * alpha + bg * (1 - alpha)), 0, 255).astype(np.uint8)
    channels = 1 if mode == "LA" else 3
    expected_img = Image.fromarray(flat).convert("L") if channels == 1 else Image.fromarray(flat)
    got = _decode(path, channels, background=background)
    assert np.abs(got.astype(int) - _fit(expected_img).astype(int)).max() <= 1  # rounding of the blend


def test_sixteen_bit_grey_is_scaled_to_eight_bits(tmp_path: Path) -> None:
    values = (_pattern(40, 26, seed=4, channels=1).astype(np.uint16) * 257)  # 0..65535
    values[0, 0] = 65535
    path = _save(tmp_path / "a.png", Image.fromarray(values), "PNG")
    with Image.open(path) as stored:
        assert stored.mode.startswith("I")
    expected = _fit(Image.fromarray((values / 257).round().astype(np.uint8)))
    assert np.array_equal(_decode(path, 1), expected)


def test_gif_first_frame_is_used(tmp_path: Path) -> None:
    first, second = (Image.fromarray(_pattern(30, 30, seed=s)).quantize(64) for s in (5, 6))
    path = tmp_path / "a.gif"
    first.save(path, save_all=True, append_images=[second], duration=100, loop=0)
    with Image.open(path) as stored:
        expected = _fit(stored.convert("RGB"))  # frame 0
        stored.seek(1)
        other = _fit(stored.convert("RGB"))
    got = _decode(path, 3)
    assert np.array_equal(got, expected) and not np.array_equal(got, other)


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    img = Image.fromarray(_pattern(40, 20, seed=7))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = _save(tmp_path / "a.jpg", img, "JPEG", exif=exif, quality=95)
    with Image.open(path) as stored:
        upright = ImageOps.exif_transpose(stored)
        assert upright.size == (20, 40)
        expected = _fit(upright.convert("RGB"))
    assert np.array_equal(_decode(path, 3), expected)
    (width, height, _), _ = image_decode.read_header(path)
    assert (width, height) == (20, 40)


def test_centre_crop_is_the_short_side_resized_then_the_centre(tmp_path: Path) -> None:
    """The semantics spelled out: resize so the short side is R, crop the central R x R. (Here the resized
    size and the crop are whole pixels; otherwise the one-resample fit avoids rounding them.)"""
    img = Image.fromarray(_pattern(100, 50, seed=8))
    path = _save(tmp_path / "a.png", img, "PNG")
    resized = img.resize((2 * R, R), Image.LANCZOS)
    expected = np.asarray(resized.crop((R // 2, 0, R // 2 + R, R))).transpose(2, 0, 1)
    assert np.abs(_decode(path, 3).astype(int) - expected.astype(int)).max() <= 1


def test_large_jpeg_is_decoded_at_reduced_scale_close_to_a_full_decode(tmp_path: Path) -> None:
    path = _save(tmp_path / "a.jpg", Image.fromarray(_pattern(640, 480, seed=9)), "JPEG", quality=95)
    with Image.open(path) as stored:
        full = _fit(stored.convert("RGB"))
    with Image.open(path) as probe:  # the draft really kicks in for this size
        probe.draft("RGB", (4 * R * 640 // 480, 4 * R))
        assert probe.size[1] < 480
    got = _decode(path, 3)
    diff = np.abs(got.astype(int) - full.astype(int))
    assert diff.mean() < 2 and diff.max() < 24


# ---------------------------------------------------------------------------------------------------
# Sources and the class rule
# ---------------------------------------------------------------------------------------------------


def test_folder_is_scanned_recursively_sorted_with_classes_from_first_level_folders(tmp_path: Path,
                                                                                   cache: Path) -> None:
    root = tmp_path / "data"
    _save(root / "dogs" / "b.png", Image.fromarray(_pattern(20, 20, 1)))
    _save(root / "cats" / "deep" / "er" / "a.png", Image.fromarray(_pattern(20, 30, 2)))
    _save(root / "cats" / "z.jpg", Image.fromarray(_pattern(30, 20, 3)), "JPEG")
    _save(root / "cats" / ".hidden.png", Image.fromarray(_pattern(20, 20, 4)))
    _save(root / ".git" / "x.png", Image.fromarray(_pattern(20, 20, 5)))
    data = _open(root, cache)
    assert data.names == ["cats/deep/er/a.png", "cats/z.jpg", "dogs/b.png"]
    assert data.class_names == ["cats", "dogs"] and data.labels.tolist() == [0, 0, 1]
    assert data.report.classes == {"cats": 2, "dogs": 1} and data.report.files == 3
    for name, row in zip(data.names, _rows(data)):
        with Image.open(root / name) as img:
            assert np.array_equal(row, _fit(img.convert("RGB")))


@pytest.mark.parametrize("layout, labelled", [
    ({"a.png", "cats/b.png", "dogs/c.png"}, False),  # an image at the top: no classes
    ({"cats/b.png", "cats/c.png"}, False),  # one class folder only
    ({"wrap/cats/b.png", "wrap/dogs/c.png"}, True),  # a single wrapping folder is stepped into
    ({"wrap/inner/cats/b.png", "wrap/inner/dogs/c.png"}, True),
    ({"a.png", "b.png"}, False),
])
def test_class_rule(tmp_path: Path, cache: Path, layout: set[str], labelled: bool) -> None:
    root = tmp_path / "data"
    for i, name in enumerate(sorted(layout)):
        _save(root / name, Image.fromarray(_pattern(20, 20, i)))
    data = _open(root, cache)
    assert (data.class_names == ["cats", "dogs"]) if labelled else (data.class_names is None and data.labels is None)
    if not labelled:
        assert data.report.no_labels_reason
        with pytest.raises(DataError, match="conditional run needs labels") as error:
            _open(root, cache, labels="required")
        assert "\n" not in str(error.value)
    assert _open(root, cache, labels="none").labels is None


def test_zip_reads_the_same_images_and_classes_as_the_folder(tmp_path: Path, cache: Path) -> None:
    root = _labelled_folder(tmp_path / "photos")
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(root.rglob("*.png")):
            zf.write(path, "photos/" + path.relative_to(root).as_posix())  # a wrapping top folder, as zips often have
        zf.writestr("__MACOSX/photos/._0.png", b"resource fork")
        zf.writestr("photos/.DS_Store", b"finder")
    folder, zipped = _open(root, cache), _open(archive, cache)
    assert zipped.class_names == folder.class_names == ["cats", "dogs"]
    assert np.array_equal(zipped.labels, folder.labels)
    assert np.array_equal(_rows(zipped), _rows(folder))
    assert zipped.report.skipped == []
    for cached in (False, True):  # and through the per-item path (each worker opens the archive itself)
        per_item = _open(archive, cache, memory_budget=0 if not cached else None)
        x, y = next(iter(per_item.dataloader(6, shuffle=False, num_workers=1 if not cached else 0)))
        assert torch.equal(x, torch.from_numpy(_rows(folder)).float() / 127.5 - 1) and y.tolist() == [0, 0, 0, 1, 1, 1]


# ---------------------------------------------------------------------------------------------------
# Bad files
# ---------------------------------------------------------------------------------------------------


def test_unreadable_files_are_skipped_counted_and_named_in_one_warning_line(tmp_path: Path, cache: Path) -> None:
    root = _labelled_folder(tmp_path / "data", per_class=4)
    good = root / "cats" / "0.png"
    (root / "cats" / "cut.png").write_bytes(good.read_bytes()[:60])
    jpeg = _save(root / "dogs" / "cut.jpg", Image.fromarray(_pattern(30, 30, 7)), "JPEG")
    jpeg.write_bytes(jpeg.read_bytes()[:-300])
    (root / "dogs" / "text.png").write_text("not an image")
    (root / "dogs" / "empty.jpg").write_bytes(b"")
    (root / "notes.txt").write_text("a README")
    _broken_png(root / "cats" / "garbled.png")
    data = _open(root, cache)
    bad = {"cats/cut.png", "dogs/cut.jpg", "dogs/text.png", "dogs/empty.jpg", "notes.txt", "cats/garbled.png"}
    assert {s.name for s in data.skipped_files} == bad and len(data) == 8
    assert data.class_names == ["cats", "dogs"]  # the stray notes.txt does not hide the classes
    warnings = [line for line in data.log_lines if "warning" in line]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("gan_accel: warning: skipped 6 of 14 files that are not readable images")
    listed = data.skipped_list_path.read_text().splitlines()
    assert {line.split("\t")[0] for line in listed} == bad and str(data.skipped_list_path) in warnings[0]
    reasons = {s.name: s.reason for s in data.skipped_files}
    assert reasons["dogs/text.png"].startswith("not an image") and reasons["cats/cut.png"].startswith("truncated")
    # The run folder gets the list, the class names and the record of the data.
    written = data.write_run_files(tmp_path / "run")
    assert {p.name for p in written} == {"data.json", "class_names.json", "skipped_files.txt"}
    assert json.loads((tmp_path / "run" / "class_names.json").read_text()) == ["cats", "dogs"]
    # A second open reuses the scan and says the same.
    again = _open(root, cache)
    assert {s.name for s in again.skipped_files} == bad and len(again) == 8


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_file_that_turns_bad_after_the_scan_is_skipped_and_counted(tmp_path: Path, cache: Path,
                                                                    num_workers: int) -> None:
    root = _labelled_folder(tmp_path / "data", per_class=4)
    data = _open(root, cache, memory_budget=0)  # per-item decoding
    (root / data.names[0]).unlink()
    path = root / data.names[5]
    path.write_bytes(path.read_bytes()[:50])
    loader = data.dataloader(4, shuffle=False, num_workers=num_workers)
    sizes = [x.shape[0] for x, _ in loader]
    assert sizes == [4, 4]  # every batch full: a replacement stands in for each bad file
    assert data.failed_during_training == 2
    assert [x.shape[0] for x, _ in loader] == [4, 4] and data.failed_during_training == 2  # counted once each


# ---------------------------------------------------------------------------------------------------
# Errors: one line each, before anything is decoded
# ---------------------------------------------------------------------------------------------------


def _error_cases(tmp_path: Path) -> dict[str, tuple[object, dict, str]]:
    empty = tmp_path / "empty"
    empty.mkdir()
    hidden = tmp_path / "hidden"
    _save(hidden / ".a.png", Image.fromarray(_pattern(20, 20, 1)))
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "a.txt").write_text("text")
    (junk / "b.png").write_bytes(b"")
    fake_zip = tmp_path / "fake.zip"
    fake_zip.write_text("not a zip")
    one = _save(tmp_path / "one" / "a.png", Image.fromarray(_pattern(20, 20, 1)))
    few = _labelled_folder(tmp_path / "few", per_class=2)
    return {
        "missing": (tmp_path / "nope", {}, "does not exist"),
        "empty folder": (empty, {}, "holds no files"),
        "only hidden files": (hidden, {}, "holds no files"),
        "no readable image": (junk, {}, "no readable image"),
        "not a zip": (fake_zip, {}, "not a readable ZIP"),
        "a single file": (one, {}, "is a file"),
        "fewer than a batch": (few, {"batch_size": 5}, "fewer than one batch"),
        "labels required": (one.parent, {"labels": "required"}, "needs labels"),
        "resolution too small": (few, {"resolution": 4}, "resolution"),
        "resolution absurd": (few, {"resolution": 100_000}, "resolution"),
        "resolution not a number": (few, {"resolution": "64"}, "resolution"),
        "channels": (few, {"channels": 2}, "channels"),
        "crop": (few, {"crop": "top"}, "crop"),
        "labels mode": (few, {"labels": "yes"}, "labels"),
        "background": (few, {"background": "grey"}, "background"),
    }


def test_every_error_is_one_line_naming_the_fix(tmp_path: Path, cache: Path) -> None:
    for case, (source, kwargs, words) in _error_cases(tmp_path).items():
        with pytest.raises(DataError) as error:
            _open(source, cache / "x", **kwargs)
        message = str(error.value)
        assert words in message and "\n" not in message and ":" in message, (case, message)
        assert isinstance(error.value, GanAccelError) and isinstance(error.value, ValueError)
    assert not (cache / "x").exists() or all(p.name.endswith(".json") for p in (cache / "x").rglob("*.*")), \
        "a refused source decodes nothing"


def test_dataloader_refuses_fewer_images_than_one_batch(tmp_path: Path, cache: Path) -> None:
    data = _open(_labelled_folder(tmp_path / "data", per_class=2), cache)
    with pytest.raises(DataError, match="fewer than one batch of 5"):
        data.dataloader(5)
    data.num_processes = 2  # as under a 2-process launch: one batch on each
    with pytest.raises(DataError, match=r"fewer than one batch of 6 \(2 processes x 3\)"):
        data.dataloader(3)
