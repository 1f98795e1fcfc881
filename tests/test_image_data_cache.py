"""Tests for gan_accel.data.open_image_data's cache and what is read from it: a second open decodes nothing, the
cache is rebuilt when the files or the preprocessing change, sets over the memory budget are decoded per item;
the batches (format, flip, random crop, default channels, the resume check); two processes (one builds, both
read the same bytes); one scan serving every preprocessing.

The images come from tests/image_files.py; decoding, sources, bad files and errors are in tests/test_image_data.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gan_accel.data import image_decode, open_image_data
from gan_accel.errors import DataError
from image_files import R, _broken_png, _labelled_folder, _open, _pattern, _rows, _save
from image_files import cache  # noqa: F401 (the fixture)


# ---------------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def count_decodes(monkeypatch):
    calls: list[int] = []
    real = image_decode.decode_image

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(image_decode, "decode_image", counted)
    return calls


def test_second_open_decodes_nothing_and_reads_the_same_bytes(tmp_path: Path, cache: Path, count_decodes) -> None:
    root = _labelled_folder(tmp_path / "data")
    first = _open(root, cache)
    assert first.cached and len(count_decodes) == 6
    count_decodes.clear()
    second = _open(root, cache)
    assert count_decodes == [] and second.fingerprint == first.fingerprint
    assert np.array_equal(_rows(second), _rows(first))
    assert isinstance(second.dataset().array, np.memmap)


def test_build_in_worker_processes_gives_the_same_cache(tmp_path: Path, cache: Path) -> None:
    root = _labelled_folder(tmp_path / "data", per_class=5)
    _broken_png(root / "dogs" / "garbled.png")  # found by the decode, in a worker: dropped from the array
    alone = _open(root, cache / "a", build_workers=0)
    pooled = _open(root, cache / "b", build_workers=2)
    assert len(pooled) == len(alone) == 10 and pooled.fingerprint == alone.fingerprint
    assert np.array_equal(_rows(pooled), _rows(alone)) and np.array_equal(pooled.labels, alone.labels)
    assert [s.name for s in pooled.skipped_files] == ["dogs/garbled.png"]


def test_default_cache_root_follows_the_environment(tmp_path: Path, monkeypatch) -> None:
    from gan_accel.data import default_cache_root

    monkeypatch.setenv("GAN_ACCEL_CACHE", str(tmp_path / "mine"))
    assert default_cache_root() == tmp_path / "mine" / "images"
    monkeypatch.delenv("GAN_ACCEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_root() == tmp_path / "xdg" / "gan_accel" / "images"


@pytest.mark.parametrize("change", ["touch", "add", "remove", "rewrite", "resolution", "channels", "crop",
                                    "background"])
def test_cache_is_rebuilt_when_the_files_or_the_preprocessing_change(tmp_path: Path, cache: Path, count_decodes,
                                                                     change: str) -> None:
    root = _labelled_folder(tmp_path / "data")
    before = _open(root, cache)
    count_decodes.clear()
    kwargs = {}
    target = root / "cats" / "0.png"
    if change == "touch":
        os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    elif change == "add":
        _save(root / "dogs" / "new.png", Image.fromarray(_pattern(20, 20, 99)))
    elif change == "remove":
        target.unlink()
    elif change == "rewrite":  # same name and mtime, other size
        stamp = target.stat().st_mtime_ns
        _save(target, Image.fromarray(_pattern(30, 30, 98)))
        os.utime(target, ns=(stamp, stamp))
    elif change == "resolution":
        kwargs["resolution"] = 8
    elif change == "channels":
        kwargs["channels"] = 1
    elif change == "crop":
        kwargs["crop"] = "random"
    else:
        kwargs["background"] = "black"
    after = _open(root, cache, **kwargs)
    assert after.fingerprint != before.fingerprint
    assert len(count_decodes) == len(after) > 0  # decoded again, every image
    expected = len(before) + {"add": 1, "remove": -1}.get(change, 0)
    assert len(after) == expected


def test_sets_over_the_memory_budget_are_decoded_per_item_with_the_same_pixels(tmp_path: Path, cache: Path) -> None:
    root = _labelled_folder(tmp_path / "data")
    cached = _open(root, cache)
    per_item = _open(root, cache, memory_budget=6 * 3 * R * R - 1)  # one byte short of the set
    assert cached.cached and not per_item.cached and "memory budget" in per_item.note
    assert per_item.fingerprint == cached.fingerprint  # the same data, prepared the same way
    assert np.array_equal(_rows(per_item), _rows(cached))


# ---------------------------------------------------------------------------------------------------
# Batches: format, flip, random crop, default channels; the global RNG left alone
# ---------------------------------------------------------------------------------------------------


def test_batches_are_float_in_range_with_int64_labels_and_flip_mirrors_half(tmp_path: Path, cache: Path) -> None:
    data = _open(_labelled_folder(tmp_path / "data", per_class=32), cache)
    rows = torch.from_numpy(_rows(data)).float() / 127.5 - 1
    state = torch.get_rng_state()
    x, y = next(iter(data.dataloader(64, shuffle=False, random_flip=True)))
    assert torch.equal(torch.get_rng_state(), state), "augmentation must not draw from the global generator"
    assert x.dtype == torch.float32 and x.shape == (64, 3, R, R) and y.dtype == torch.int64
    same = [torch.equal(x[i], rows[i]) for i in range(64)]
    mirrored = [torch.equal(x[i], rows[i].flip(-1)) for i in range(64)]
    assert all(s or m for s, m in zip(same, mirrored)) and 10 < sum(mirrored) < 54


def test_unlabelled_batches_are_the_images_alone(tmp_path: Path, cache: Path) -> None:
    data = _open(_labelled_folder(tmp_path / "data"), cache, labels="none")
    batch = next(iter(data.dataloader(3)))
    assert isinstance(batch, torch.Tensor) and batch.shape == (3, 3, R, R)


def test_channels_default_to_what_the_data_has(tmp_path: Path, cache: Path) -> None:
    grey = tmp_path / "grey"
    _save(grey / "a.png", Image.fromarray(_pattern(20, 20, 1, channels=1)))
    _save(grey / "b.gif", Image.fromarray(_pattern(20, 20, 2)).convert("L").convert("P"))  # a grey palette
    assert _open(grey, cache).prep.channels == 1
    _save(grey / "c.png", Image.fromarray(_pattern(20, 20, 3)))
    mixed = _open(grey, cache)
    assert mixed.prep.channels == 3 and _rows(mixed).shape[1] == 3
    assert _open(grey, cache, channels=1).prep.channels == 1


@pytest.mark.parametrize("size", [(40, 20), (20, 40)])
@pytest.mark.parametrize("budget", [None, 0])
def test_random_crop_draws_windows_of_the_short_side_resized_image(tmp_path: Path, cache: Path, size, budget) -> None:
    img = Image.fromarray(_pattern(*size, seed=11))
    _save(tmp_path / "data" / "a.png", img)
    data = _open(tmp_path / "data", cache, crop="random", memory_budget=budget)
    # Independently: resize so the short side is R (the long side 2R, capped at 1.5R by keeping the centre).
    w, h = size
    kept = 1.5 * min(w, h)
    box = ((w - kept) / 2, 0, (w + kept) / 2, h) if w > h else (0, (h - kept) / 2, w, (h + kept) / 2)
    strip = np.asarray(img.resize((24, R) if w > h else (R, 24), Image.LANCZOS, box=box)).transpose(2, 0, 1)
    windows = [strip[:, :, o:o + R] if w > h else strip[:, o:o + R, :] for o in range(24 - R + 1)]
    seen = set()
    loader = data.dataloader(1, num_workers=0)
    for _ in range(30):
        x = next(iter(loader))
        got = ((x[0] + 1) * 127.5).round().to(torch.uint8).numpy()
        match = [o for o, win in enumerate(windows) if np.array_equal(got, win)]
        assert match, "every draw is one window of the strip"
        seen.add(match[0])
    assert len(seen) >= 3


def test_check_resume_refuses_changed_data_in_one_line(tmp_path: Path, cache: Path) -> None:
    root = _labelled_folder(tmp_path / "data")
    run = tmp_path / "run"
    _open(root, cache).write_run_files(run)
    saved = json.loads((run / "data.json").read_text())
    assert _open(root, cache).check_resume(saved)
    _save(root / "dogs" / "new.png", Image.fromarray(_pattern(20, 20, 50)))
    changed = _open(root, cache)
    with pytest.raises(DataError, match="changed since this run started") as error:
        changed.check_resume(saved)
    assert "images 6 -> 7" in str(error.value) and "--allow-data-change" in str(error.value)
    lines: list[str] = []
    assert changed.check_resume(saved, allow_changed=True, log=lines.append) is False
    assert len(lines) == 1 and lines[0].startswith("gan_accel: warning: the training data changed")
    assert _open(root, cache).check_resume(None)  # no data.json: nothing to compare


# ---------------------------------------------------------------------------------------------------
# Two processes: one builds, both read the same bytes; an error stops both
# ---------------------------------------------------------------------------------------------------


def _two_process_body(root: str, cache: str, out: str) -> None:
    from accelerate import Accelerator

    from gan_accel.data import image_decode as decode_module

    acc = Accelerator(cpu=True)
    decodes = []
    real = decode_module.decode_image
    decode_module.decode_image = lambda *a, **k: (decodes.append(1), real(*a, **k))[1]
    data = open_image_data(root, R, cache_dir=cache, accelerator=acc, log=None)
    loader = acc.prepare(data.dataloader(2, shuffle=False))
    batches = [hashlib_hex(x.numpy().tobytes()) for x, _ in loader]
    record = {"rank": acc.process_index, "decodes": len(decodes), "cached": data.cached,
              "array": hashlib_hex(np.asarray(data.dataset().array).tobytes()), "batches": batches}
    try:
        open_image_data(root, R, cache_dir=cache, accelerator=acc, log=None, labels="none", batch_size=100)
    except DataError as error:
        record["error"] = str(error)
    Path(out, f"rank{acc.process_index}.json").write_text(json.dumps(record))


def hashlib_hex(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@pytest.mark.slow
def test_two_processes_one_builds_both_memory_map_the_same_bytes(tmp_path: Path) -> None:
    from conftest import launch_two_processes

    root = _labelled_folder(tmp_path / "data", per_class=4)
    launch_two_processes(_two_process_body, args=(str(root), str(tmp_path / "cache"), str(tmp_path)))
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["decodes"] for r in records) == [0, 8]  # one process decoded every image, the other none
    assert records[0]["array"] == records[1]["array"] and all(r["cached"] for r in records)
    assert [len(r["batches"]) for r in records] == [2, 2]  # 8 images, batch 2 per process: 2 batches each
    assert not set(records[0]["batches"]) & set(records[1]["batches"])  # each process its own share
    assert records[0]["error"] == records[1]["error"] and "fewer than one batch of 200" in records[0]["error"]


def test_one_listing_and_one_scan_serve_every_preprocessing(tmp_path: Path, cache: Path, monkeypatch) -> None:
    from gan_accel.data import Preprocessing, scan_images
    from gan_accel.data.image_sources import FolderSource

    root = _labelled_folder(tmp_path / "data")
    listings: list[int] = []
    real_entries = FolderSource.entries
    monkeypatch.setattr(FolderSource, "entries", lambda self: (listings.append(1), real_entries(self))[1])
    images = scan_images(root, cache_dir=cache)
    assert images.sizes == [(24, 18)] * 6
    centre = images.open(Preprocessing(R), log=None)
    grey = images.open(Preprocessing(16, 1, "random"), log=None)
    assert listings == [1], "the folder is listed once, whatever is opened from the scan"
    assert centre.prep == Preprocessing(R, 3) and grey.prep.channels == 1 and len(centre) == len(grey) == 6
    # The real images for evaluation: the cache's rows and a fresh decode of the same files agree.
    per_item = images.open(Preprocessing(R), memory_budget=0, log=None)
    assert centre.cached and not per_item.cached
    assert torch.equal(centre.real_images(4, seed=3), per_item.real_images(4, seed=3))
    assert grey.real_images(10).shape == (6, 1, 16, 16)  # centre crops, at most every image
    with pytest.raises(DataError, match="crop 'middle' is unknown"):
        Preprocessing(R, crop="middle")
