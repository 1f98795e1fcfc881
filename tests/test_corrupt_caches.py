"""A cached download or cache file that is truncated, damaged, not a regular file or a pickle with code is named as
corrupt in one line that gives its path and the fix, never as missing, never with a traceback; "could run code" only
for a file that names a callable. The Inception weights in torch hub's cache (with the stand-in backend the other
Inception tests use) and the cached MNIST classifier."""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import gan_accel.eval.inception as inception
import gan_accel.eval.weights as weights
from gan_accel.eval.inception import WEIGHTS_ENV, WEIGHTS_FILE, InceptionUnavailable, inception_extractor
from gan_accel.eval.weights import WeightsFile
from gan_accel.eval.mnist import ClassifierCacheError, MnistClassifier, load_or_train_classifier

GOOD = bytes(range(256)) * 64  # the stand-in for the real weights: the cache is held to its hash


class Payload:
    """Unpickling it would call os.mkdir: a pickle that really holds code (never unpickled here)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def make_bad(path: Path, case: str, good: bytes, marker: Path) -> None:
    """Put the bad cache ``case`` at ``path`` (where the good file ``good`` belongs)."""
    if case == "truncated":
        path.write_bytes(good[:len(good) // 2])
    elif case == "same size, other bytes":
        damaged = bytearray(good)
        damaged[len(good) // 2] ^= 0xFF
        path.write_bytes(bytes(damaged))
    elif case == "FIFO":
        os.mkfifo(path)
    elif case == "folder":
        path.mkdir()
    elif case == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif case == "dangling link":
        path.symlink_to(path.parent / "gone")
    elif case == "pickle with code":
        path.write_bytes(pickle.dumps({"weights": Payload(marker)}))
    else:
        raise ValueError(case)


CASES = ["truncated", "same size, other bytes", "FIFO", "folder", "link to /dev/zero", "dangling link",
         "pickle with code"]


def check_line(line: str, path: Path, case: str, fix: str) -> None:
    assert "\n" not in line and str(path) in line and fix in line, line
    assert "corrupt" in line and "does not exist" not in line and "not in " not in line, line
    assert ("could run" in line) == (case == "pickle with code"), line
    if case == "pickle with code":
        assert "mkdir" in line, line
    if case == "folder":
        assert f"rm -r {path}" in line, line


@pytest.fixture
def hub(monkeypatch, tmp_path) -> Path:
    """torch hub's cache under tmp_path, no weights variable, no network, the stand-in's hash as the right one."""
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(inception, "WEIGHTS", replace(inception.WEIGHTS, sha256=hashlib.sha256(GOOD).hexdigest()))
    monkeypatch.setattr(WeightsFile, "fetch", lambda *a, **k: pytest.fail("downloaded over the cache"))
    folder = Path(torch.hub.get_dir()) / "checkpoints"
    folder.mkdir(parents=True)
    return folder


def stand_in(weights: str, features_list: list[str]) -> torch.nn.Module:
    return torch.nn.Identity()


@pytest.mark.parametrize("case", CASES)
def test_a_bad_inception_cache_is_named_corrupt_with_the_fix(hub, tmp_path, case):
    cached = hub / WEIGHTS_FILE
    make_bad(cached, case, GOOD, tmp_path / "PAYLOAD_RAN")
    for _ in range(2):  # every use, not only the first
        with pytest.raises(InceptionUnavailable) as caught:
            inception_extractor(_backend=stand_in)
        check_line(str(caught.value), cached, case, f"delete it (rm ")
        assert "download it again" in str(caught.value)
    assert not (tmp_path / "PAYLOAD_RAN").exists()
    assert os.path.lexists(cached), "the user's file is named, never removed or replaced"


def test_a_good_cache_is_hashed_once_and_a_change_is_noticed(hub, monkeypatch):
    cached = hub / WEIGHTS_FILE
    cached.write_bytes(GOOD)
    hashed: list[str] = []
    import gan_accel.storage.reading as reading

    original = reading.file_sha256
    monkeypatch.setattr(reading, "file_sha256", lambda path, *a: hashed.append(str(path)) or original(path, *a))
    weights._VERIFIED.clear()
    for _ in range(3):
        inception_extractor(_backend=stand_in)
    assert hashed == [str(cached)]
    damaged = bytearray(GOOD)
    damaged[0] ^= 1
    cached.write_bytes(bytes(damaged))  # same size, new bytes: a new modification time, hashed again
    os.utime(cached, ns=(cached.stat().st_atime_ns, cached.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(InceptionUnavailable, match="corrupt"):
        inception_extractor(_backend=stand_in)
    assert len(hashed) == 2


@pytest.mark.parametrize("case", ["FIFO", "folder", "link to /dev/zero"])
def test_a_weights_path_that_is_not_a_file_is_named_as_what_it_is(tmp_path, monkeypatch, case):
    path = tmp_path / WEIGHTS_FILE
    make_bad(path, case, GOOD, tmp_path / "PAYLOAD_RAN")
    monkeypatch.setenv(WEIGHTS_ENV, str(path))
    with pytest.raises(InceptionUnavailable) as caught:
        inception_extractor(_backend=stand_in)
    line = str(caught.value)
    kind = {"FIFO": "a FIFO", "folder": "a folder", "link to /dev/zero": "a character device"}[case]
    assert str(path) in line and f"not a regular file: {kind}" in line and "does not exist" not in line, line


def test_eval_with_a_corrupt_inception_cache_exits_2_with_one_line(tmp_path):
    """The exit path: ``gan-accel``'s entry point (run_script) prints the one line and exits 2, no traceback."""
    home = tmp_path / "torch_home"
    cached = home / "hub" / "checkpoints" / WEIGHTS_FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(GOOD[:100])
    code = ("import gan_accel.eval.inception as i, torch\n"
            "from gan_accel.ending import run_script\n"
            "raise SystemExit(run_script(lambda: i.inception_extractor(_backend=lambda w, f: torch.nn.Identity()) "
            "and 0))\n")
    env = {**os.environ, "TORCH_HOME": str(home), "OMP_NUM_THREADS": "1"}
    env.pop(WEIGHTS_ENV, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    check_line(lines[0], cached, "truncated", "delete it (rm ")
    assert lines[0].startswith("error: the cached Inception weights ") and "Traceback" not in done.stderr


# -- the cached MNIST classifier ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_classifier(tmp_path_factory) -> bytes:
    """The bytes of a cached classifier as gan_accel writes it (trained for one tiny epoch)."""
    path = tmp_path_factory.mktemp("judge") / "clf.safetensors"
    images = torch.randint(0, 256, (32, 1, 28, 28), dtype=torch.uint8)
    load_or_train_classifier(path, images, torch.arange(32) % 10, epochs=1, batch_size=16)
    return path.read_bytes()


@pytest.mark.parametrize("case", CASES)
def test_a_bad_classifier_cache_is_named_corrupt_with_the_fix(good_classifier, tmp_path, case):
    cached = tmp_path / "mnist_classifier.safetensors"
    make_bad(cached, case, good_classifier, tmp_path / "PAYLOAD_RAN")
    with pytest.raises(ClassifierCacheError) as caught:
        load_or_train_classifier(cached, torch.zeros(1, 1, 28, 28, dtype=torch.uint8), torch.zeros(1).long())
    check_line(str(caught.value), cached, case, "delete the file to retrain it (rm ")
    assert not (tmp_path / "PAYLOAD_RAN").exists() and os.path.lexists(cached)


def test_the_cached_classifier_as_written_loads_and_equals_itself(good_classifier, tmp_path):
    cached = tmp_path / "mnist_classifier.safetensors"
    cached.write_bytes(good_classifier)
    model = load_or_train_classifier(cached, torch.zeros(1, 1, 28, 28, dtype=torch.uint8), torch.zeros(1).long())
    assert isinstance(model, MnistClassifier) and not model.training
