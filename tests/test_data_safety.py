"""What the data layer and the caches read from disk is checked before it is trusted.

Bounded reads (ZIP bombs, huge images, FIFOs, devices, links out of the folder, oversized files), caches that are
verified (a changed byte, unparsable or forged metadata: one line and a rebuild), builds that leave nothing behind
(workers die with a killed parent, temporaries of a killed build are cleared, a full disk is one line).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gan_accel.data import image_cache, image_decode, image_sources, open_image_data
from gan_accel.data.image_sources import RefusedFile, open_regular
from gan_accel.errors import DataError
from gan_accel.eval.feature_cache import cached_features

R = 8


def _folder(root: Path, count: int = 4) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / f"img{i}.png")
    return root


def _expected(root: Path) -> np.ndarray:
    """The cache's content computed independently: each file decoded on its own, in name order."""
    prep = image_decode.Preprocessing(R, 3)
    return np.stack([image_decode.decode_image(open(p, "rb"), prep) for p in sorted(root.glob("*.png"))])


def _open(root: Path, cache: Path, lines: list[str] | None = None):
    return open_image_data(root, R, 3, cache_dir=cache, log=(lines.append if lines is not None else None))


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height (one grey row of data; nothing big is ever written)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 11)) + chunk(b"IEND", b"")


# --- archives -------------------------------------------------------------------------------------------------------

def _zip_of_zeros(path: Path, members: int, size: int) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for m in range(members):
            with archive.open(f"bomb{m}.png", "w", force_zip64=True) as member:
                chunk = bytes(1 << 20)
                for _ in range(size >> 20):
                    member.write(chunk)
    return path


def test_zip_bomb_is_refused_in_one_line_with_bounded_memory(tmp_path):
    bomb = _zip_of_zeros(tmp_path / "photos.zip", members=2, size=64 << 20)
    assert bomb.stat().st_size < 1 << 20
    # The measure can fail: inflating one member whole, as the header scan once did, peaks at its full size.
    tracemalloc.start()
    with zipfile.ZipFile(bomb) as archive:
        archive.read("bomb0.png")
    whole = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert whole >= 64 << 20
    tracemalloc.start()
    with pytest.raises(DataError) as caught:
        _open(bomb, tmp_path / "cache")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    message = str(caught.value)
    assert "\n" not in message and "ZIP bomb" in message and "bomb0.png" in message
    assert peak < 4 << 20, peak


def test_zip_member_larger_than_the_limit_is_refused(tmp_path, monkeypatch):
    folder = _folder(tmp_path / "imgs", 2)
    archive = tmp_path / "imgs.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for p in sorted(folder.iterdir()):
            out.write(p, p.name)
    sizes = [p.stat().st_size for p in folder.iterdir()]
    monkeypatch.setattr(image_sources, "MAX_FILE_BYTES", min(sizes) - 1)
    with pytest.raises(DataError, match="declares"):
        _open(archive, tmp_path / "cache")
    monkeypatch.setattr(image_sources, "MAX_FILE_BYTES", max(sizes))
    assert len(_open(archive, tmp_path / "cache")) == 2


# --- images and files -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("side", [12000, 20000])  # Pillow warns above 89 M pixels and raises above 179 M
def test_image_bounded_in_pixels_before_decoding_in_gan_accels_words(tmp_path, side):
    root = _folder(tmp_path / "imgs", 2)
    (root / "huge.png").write_bytes(_png_header(side, side))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's DecompressionBombWarning would fail the test
        data = _open(root, tmp_path / "cache")
    assert len(data) == 2
    (reason,) = [s.reason for s in data.skipped_files if s.name == "huge.png"]
    assert reason.startswith("too large:") and f"{image_decode.MAX_PIXELS:,} pixels gan_accel decodes" in reason
    if side == 12000:
        assert "12000x12000" in reason


def test_pixel_limit_is_checked_before_decoding(tmp_path, monkeypatch):
    path = tmp_path / "a.png"
    Image.new("RGB", (20, 10)).save(path)
    monkeypatch.setattr(image_decode, "MAX_PIXELS", 199)
    with pytest.raises(image_decode.TooManyPixels, match="20x10"):
        image_decode.decode_image(str(path), image_decode.Preprocessing(R, 3))
    monkeypatch.setattr(image_decode, "MAX_PIXELS", 200)
    assert image_decode.decode_image(str(path), image_decode.Preprocessing(R, 3)).shape == (3, R, R)


def test_fifo_device_and_links_out_of_the_folder_are_skipped_unopened(tmp_path):
    root = _folder(tmp_path / "imgs", 3)
    outside = _folder(tmp_path / "elsewhere", 1) / "img0.png"
    os.mkfifo(root / "pipe.png")
    (root / "zero.png").symlink_to("/dev/zero")
    (root / "out.png").symlink_to(outside)
    (root / "sub").mkdir()
    (root / "sub" / "in.png").symlink_to(root / "img0.png")  # a link inside the folder is read
    data = _open(root, tmp_path / "cache")
    reasons = {s.name: s.reason for s in data.skipped_files}
    assert reasons["pipe.png"] == "not a regular file: a FIFO"
    assert reasons["zero.png"].startswith("a link out of the data folder")
    assert reasons["out.png"].startswith("a link out of the data folder")
    assert sorted(data.names) == ["img0.png", "img1.png", "img2.png", "sub/in.png"]
    with pytest.raises(RefusedFile, match="character device"):
        open_regular("/dev/zero")
    with pytest.raises(RefusedFile, match="FIFO"):
        open_regular(root / "pipe.png")
    for bad in (root / "pipe.png", Path("/dev/null")):  # as the data itself: one line, no wait
        with pytest.raises(DataError, match="not a folder of images"):
            _open(bad, tmp_path / "cache")


def test_files_are_bounded_in_size_before_they_are_read(tmp_path, monkeypatch):
    root = _folder(tmp_path / "imgs", 3)
    big = root / "big.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(big)
    monkeypatch.setattr(image_sources, "MAX_FILE_BYTES", big.stat().st_size - 1)
    data = _open(root, tmp_path / "cache")
    assert sorted(data.names) == ["img0.png", "img1.png", "img2.png"]
    assert dict((s.name, s.reason) for s in data.skipped_files)["big.png"].startswith(
        f"too large: {big.stat().st_size:,} bytes")


# --- the image cache ------------------------------------------------------------------------------------------------

def _prep_files(data) -> tuple[Path, Path]:
    return data.cache.file(data.prep, ".npy"), data.cache.file(data.prep, ".json")


def test_tampered_or_damaged_cache_is_named_and_rebuilt(tmp_path, capsys):
    root, cache = _folder(tmp_path / "imgs"), tmp_path / "cache"
    expected = _expected(root)
    data = _open(root, cache)
    npy, record = _prep_files(data)
    assert np.array_equal(np.load(npy), expected)
    damage = [
        ("npy", lambda: npy.write_bytes(npy.read_bytes()[:-1] + bytes([npy.read_bytes()[-1] ^ 1])), "checksum"),
        ("npy", lambda: npy.write_bytes(b"not an array"), "checksum"),
        ("npy", lambda: npy.unlink(), "cannot be read"),
        ("json", lambda: record.write_text("{"), "not valid JSON"),
        ("json", lambda: record.write_text(json.dumps({**json.loads(record.read_text()), "rows": 3})), "checksum"),
        ("scan", lambda: data.cache.scan_json.write_text("[]"), "another version"),
    ]
    for what, spoil, why in damage:
        spoil()
        lines: list[str] = []
        again = _open(root, cache, lines)
        lines += capsys.readouterr().out.splitlines()  # the scan's line goes to stdout
        warned = [line for line in lines if "cannot be used" in line]
        assert len(warned) == 1 and why in warned[0], (what, lines)
        assert np.array_equal(np.load(npy), expected), what
        assert np.array_equal(np.stack([again.dataset()[i][0].numpy() for i in range(len(again))]), expected)
        quiet: list[str] = []
        _open(root, cache, quiet)  # rebuilt: used silently from now on
        quiet += capsys.readouterr().out.splitlines()
        assert not [line for line in quiet if "cannot be used" in line or "decoding" in line], (what, quiet)


def test_forged_scan_with_a_valid_checksum_is_rebuilt_not_a_traceback(tmp_path):
    root, cache = _folder(tmp_path / "imgs"), tmp_path / "cache"
    data = _open(root, cache)
    forged = json.loads(data.cache.scan_json.read_text())
    forged.pop("sha256")
    forged.pop("version")
    forged.pop("key")
    forged["items"] = [[99, 12, 10, "RGB", False]]  # an entry that does not exist
    data.cache.write_json(data.cache.scan_json, forged)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("builtins.print", lines.append)
        again = _open(root, cache)
    assert len(again) == 4 and any("not a scan of this data" in line for line in lines)


def test_a_killed_builds_temporaries_are_cleared_by_the_next_build(tmp_path):
    root, cache = _folder(tmp_path / "imgs"), tmp_path / "cache"
    data = _open(root, cache)
    npy, record = _prep_files(data)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    left = [npy.parent / f".{npy.name}.{host}.{dead.pid}.tmp", npy.parent / f".{npy.name}.{host}.{dead.pid}.tmp.compact",
            npy.parent / f".scan.json.{host}.{dead.pid}.tmp"]
    kept = [npy.parent / f".{npy.name}.{host}.{os.getppid()}.tmp",  # a live writer
            npy.parent / f".{npy.name}.other-host.{dead.pid}.tmp", npy.parent / "notes.tmp"]
    for path in left + kept:
        path.write_bytes(b"x" * 100)
    record.unlink()  # the next open builds again
    _open(root, cache)
    assert [p.exists() for p in left] == [False] * 3
    assert [p.exists() for p in kept] == [True] * 3


def test_a_full_disk_during_the_build_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    root, cache = _folder(tmp_path / "imgs"), tmp_path / "cache"

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(DataError) as caught:
        _open(root, cache)
    assert "\n" not in str(caught.value) and "No space left on device" in str(caught.value)
    folder = next(p for p in cache.iterdir())
    assert sorted(p.name for p in folder.iterdir()) == ["scan.json"]


def test_preallocation_reserves_the_blocks(tmp_path):
    path = tmp_path / "a.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(4, 1 << 20))
    assert path.stat().st_blocks * 512 < 1 << 20  # sparse: a memory-mapped write may meet a full disk
    image_cache.preallocate(path)
    assert path.stat().st_blocks * 512 >= 4 << 20


_KILLED_PARENT = """
import functools, os, signal, sys, threading, time
import numpy as np
from torch.utils.data import DataLoader, Dataset
from gan_accel.data.image_cache import die_with_parent

out = sys.argv[1]

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        open(os.path.join(out, f"{os.getpid()}.pid"), "w").close()
        time.sleep(0.05)
        return np.zeros(1 << 20, dtype=np.uint8)  # pickled through the pipe (as decoded images are): fills it

def kill_when_started():
    while len([n for n in os.listdir(out) if n.endswith(".pid")]) < 2:
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)

threading.Thread(target=kill_when_started, daemon=True).start()
collate = lambda items: items
init = functools.partial(die_with_parent, parent=os.getpid()) if sys.argv[2] == "1" else None
for batch in DataLoader(Slow(), batch_size=1, num_workers=2, worker_init_fn=init, prefetch_factor=8,
                        collate_fn=collate):
    time.sleep(10)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_decoding_workers_die_with_a_killed_parent(tmp_path):
    script = tmp_path / "build.py"
    script.write_text(textwrap.dedent(_KILLED_PARENT))
    pids: list[int] = []
    try:
        done = subprocess.run([sys.executable, str(script), str(tmp_path), "1"], timeout=120)
        assert done.returncode == -signal.SIGKILL
        pids = [int(p.name.split(".")[0]) for p in tmp_path.glob("*.pid")]
        assert len(pids) == 2
        deadline = time.monotonic() + 10
        while any(map(_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, pids))
    finally:
        for pid in pids:  # the workers this test started, should the check fail
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


# --- the real-feature cache -----------------------------------------------------------------------------------------

def test_feature_cache_is_verified_and_rebuilt_in_one_line(tmp_path):
    real = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    other = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    calls: list[int] = []

    def compute(value=real):
        calls.append(1)
        return value.clone()

    def read(lines, fingerprint="abc"):
        return cached_features(fingerprint, "Inception", 6, compute, root=tmp_path, log=lines.append)

    lines: list[str] = []
    features, cached = read(lines)
    assert not cached and torch.equal(features, real) and not lines
    features, cached = read(lines)
    assert cached and torch.equal(features, real) and not lines and len(calls) == 1
    (path,) = tmp_path.glob("abc-*.safetensors")
    # another data set's cache copied over this one (the features of other data, "from the cache")
    cached_features("xyz", "Inception", 6, functools.partial(compute, other), root=tmp_path, log=None)
    (foreign,) = tmp_path.glob("xyz-*.safetensors")
    raw = path.read_bytes()
    spoiled = raw[:-4] + bytes(b ^ 0x55 for b in raw[-4:])  # the last float's bytes changed
    for damage, why in [(foreign.read_bytes(), "other data"), (spoiled, "checksum"), (b"\0" * 10, "cannot be read")]:
        path.write_bytes(damage)
        lines = []
        features, cached = read(lines)
        assert not cached and torch.equal(features, real)
        assert len(lines) == 1 and why in lines[0] and "\n" not in lines[0]
        assert read(lines)[1] and len(lines) == 1  # replaced: verified and used from now on
