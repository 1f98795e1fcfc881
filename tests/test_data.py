"""The data path: the fast uint8 loader gives the images of torchvision's per-item path, shuffles reproducibly
and shards under Accelerate; the offline digits look like MNIST; a missing MNIST falls back (or refuses) with
one message."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from urllib.error import URLError

import pytest
import torch
from torch.utils.data import DataLoader

from gan_accel import data as gd
from gan_accel.data import (
    DatasetUnavailableError,
    UInt8ImageDataset,
    load_mnist_uint8,
    make_dataloader,
    resolve_dataset,
    synthetic_digits,
)


def _mnist_dir() -> Path:
    path = Path(os.environ.get("GAN_ACCEL_MNIST_DIR", "/work/shared/data"))
    if not (path / "MNIST" / "raw").is_dir():
        pytest.skip(f"real MNIST not found in {path}/MNIST/raw (set GAN_ACCEL_MNIST_DIR to a folder holding it)")
    return path


@pytest.fixture(scope="module")
def mnist_dir() -> Path:
    return _mnist_dir()


@pytest.fixture(scope="module")
def mnist_train(mnist_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    return load_mnist_uint8(mnist_dir, train=True, download=False)


def _id_images(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Image i is filled with the value i % 256 and labelled i, so every batch reveals its indices."""
    images = (torch.arange(n) % 256).to(torch.uint8).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous()
    return images, torch.arange(n)


# ---------------------------------------------------------------------------------------------------
# Fast loader
# ---------------------------------------------------------------------------------------------------


def test_load_mnist_uint8_shape_and_content(mnist_dir: Path, mnist_train) -> None:
    from torchvision.datasets import MNIST

    images, labels = mnist_train
    assert images.shape == (60000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (60000,) and labels.dtype == torch.int64
    test_images, _ = load_mnist_uint8(mnist_dir, train=False, download=False)
    assert test_images.shape == (10000, 1, 28, 28)
    # Independent read of a few items through torchvision's PIL path.
    ds = MNIST(str(mnist_dir), train=True, download=False)
    for i in (0, 1234, 59999):
        img, label = ds[i]
        assert torch.equal(images[i, 0], torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(28, 28))
        assert labels[i].item() == label


def test_fast_loader_matches_torchvision_per_item_path(mnist_dir: Path, mnist_train) -> None:
    from torchvision import transforms
    from torchvision.datasets import MNIST

    images, labels = mnist_train
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
    reference = DataLoader(
        MNIST(str(mnist_dir), train=True, download=False, transform=tf),
        batch_size=64,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(123),
    )
    fast = make_dataloader(images, labels, 64, generator=torch.Generator().manual_seed(123))
    assert len(fast) == len(reference) == 60000 // 64
    # Same sampler and seed -> same indices, so the batches must agree element for element.
    for (ref_x, ref_y), (x, y), _ in zip(reference, fast, range(3)):
        assert x.dtype == torch.float32 and x.shape == (64, 1, 28, 28)
        assert y.dtype == torch.int64 and y.shape == (64,)
        torch.testing.assert_close(x, ref_x, rtol=0, atol=1e-6)
        assert torch.equal(y, ref_y)
        assert x.min() >= -1 and x.max() <= 1


def test_batched_fetch_hook_is_used() -> None:
    images, labels = _id_images(100)
    loader = make_dataloader(images, labels, 10, shuffle=False)
    calls: list[list[int]] = []
    original = UInt8ImageDataset.__getitems__

    def spy(self, indices):
        calls.append(list(indices))
        return original(self, indices)

    def forbidden(self, index):
        raise AssertionError("per-item __getitem__ must not be used by the fast loader")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(UInt8ImageDataset, "__getitems__", spy)
        mp.setattr(UInt8ImageDataset, "__getitem__", forbidden)
        batches = list(loader)
    assert calls == [list(range(i, i + 10)) for i in range(0, 100, 10)]
    assert len(batches) == 10


def test_values_labels_and_drop_last() -> None:
    images, labels = _id_images(300)
    loader = make_dataloader(images, labels, 64, shuffle=False, drop_last=False)
    batches = list(loader)
    assert [len(y) for _, y in batches] == [64, 64, 64, 64, 44] and len(loader) == 5
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert torch.equal(y, torch.arange(300))
    expected = ((torch.arange(300) % 256).double() / 255 - 0.5) / 0.5  # ToTensor + Normalize, in float64
    torch.testing.assert_close(x[:, 0, 0, 0].double(), expected, rtol=0, atol=1e-6)
    assert x.min().item() == -1.0 and x.max().item() == 1.0
    assert len(make_dataloader(images, labels, 64)) == 4  # drop_last=True by default


def test_shuffle_is_reproducible_and_covers_each_item_once() -> None:
    images, labels = _id_images(256)

    def epoch(seed: int) -> torch.Tensor:
        loader = make_dataloader(images, labels, 32, generator=torch.Generator().manual_seed(seed))
        return torch.cat([y for _, y in loader])

    a, b, c = epoch(7), epoch(7), epoch(8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert not torch.equal(a, torch.arange(256))
    assert torch.equal(a.sort().values, torch.arange(256))
    # Two epochs from one loader differ (the generator advances), as with any DataLoader.
    loader = make_dataloader(images, labels, 32, generator=torch.Generator().manual_seed(7))
    first, second = (torch.cat([y for _, y in loader]) for _ in range(2))
    assert torch.equal(first, a) and not torch.equal(first, second)


def test_accelerate_prepare_shards_it() -> None:
    from accelerate.data_loader import prepare_data_loader

    images, labels = _id_images(128)
    loader = make_dataloader(images, labels, 16, shuffle=False)
    seen = []
    for rank in range(2):
        shard = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        assert isinstance(shard, DataLoader) and len(shard) == 4
        batches = list(shard)
        for x, y in batches:
            assert x.dtype == torch.float32 and x.shape == (16, 1, 4, 4) and y.dtype == torch.int64
            torch.testing.assert_close(x[:, 0, 0, 0], (y % 256).float() / 127.5 - 1)
        seen.append(torch.cat([y for _, y in batches]))
    # Rank r gets batches r, r + 2, ...: disjoint halves that together cover the data once.
    assert torch.equal(seen[0][:16], torch.arange(16)) and torch.equal(seen[1][:16], torch.arange(16, 32))
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(128))


def test_dataset_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="uint8"):
        UInt8ImageDataset(torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        UInt8ImageDataset(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.zeros(3, dtype=torch.long))


# ---------------------------------------------------------------------------------------------------
# Offline digits
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    return synthetic_digits(2000, seed=0)


def test_synthetic_digits_format_and_determinism(digits) -> None:
    images, labels = digits
    assert images.shape == (2000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (2000,) and labels.dtype == torch.int64
    assert torch.equal(torch.bincount(labels, minlength=10), torch.full((10,), 200))
    again, again_labels = synthetic_digits(2000, seed=0)
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    other, other_labels = synthetic_digits(2000, seed=1)
    assert not torch.equal(labels, other_labels)
    assert (images != other).any(dim=(1, 2, 3)).float().mean() > 0.99
    # Balanced labels: even n=10 covers every class.
    _, small_labels = synthetic_digits(10, seed=3)
    assert sorted(small_labels.tolist()) == list(range(10))
    assert synthetic_digits(0)[0].shape == (0, 1, 28, 28)
    assert synthetic_digits(4, size=32)[0].shape == (4, 1, 32, 32)


def test_synthetic_digits_look_like_mnist_frames(digits) -> None:
    images, labels = digits
    x = images.float()[:, 0] / 255
    assert (x.amax(dim=(1, 2)) > 0.8).all(), "every image has bright ink"
    # White digit on black: corners and border are background.
    border = torch.cat([x[:, :2].flatten(1), x[:, -2:].flatten(1), x[:, :, :2].flatten(1), x[:, :, -2:].flatten(1)], 1)
    assert border.mean() < 0.01
    ink = x.sum(dim=(1, 2))
    assert (ink > 20).all() and (ink < 400).all()
    # Centre of mass near the frame centre (13.5), as in MNIST, and varied by the jitter.
    grid = torch.arange(28, dtype=torch.float32)
    cy = (x.sum(2) * grid).sum(1) / ink
    cx = (x.sum(1) * grid).sum(1) / ink
    assert ((cy - 13.5).abs() < 4).all() and ((cx - 13.5).abs() < 4).all()
    assert cx.std() > 0.5 and cy.std() > 0.5
    # A "1" has less ink than an "8" in any font.
    assert ink[labels == 1].mean() < 0.8 * ink[labels == 8].mean()


def test_synthetic_digits_are_recognisable_by_mnist_knn(mnist_train, digits) -> None:
    """k-NN fitted on real MNIST must read the synthetic digits far above chance (10%)."""
    mnist_images, mnist_labels = mnist_train
    train = mnist_images[:10000].flatten(1).float() / 255
    images, labels = digits
    query = images[:500].flatten(1).float() / 255
    neighbours = mnist_labels[:10000][torch.cdist(query, train).topk(5, largest=False).indices]
    accuracy = (neighbours.mode(dim=1).values == labels[:500]).float().mean().item()
    assert accuracy > 0.3, accuracy


def test_synthetic_digits_speed() -> None:
    import time

    start = time.perf_counter()
    synthetic_digits(10000, seed=5)
    assert time.perf_counter() - start < 10  # generous: a few seconds even on a busy 2-core machine


# ---------------------------------------------------------------------------------------------------
# resolve_dataset
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Make every torchvision MNIST download attempt fail like an offline machine; record the socket timeout."""
    import torchvision.datasets.mnist as tv_mnist

    timeouts: list[float | None] = []

    def fail(url, *args, **kwargs):
        timeouts.append(socket.getdefaulttimeout())
        raise URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(tv_mnist, "download_and_extract_archive", fail)
    return timeouts


def test_mnist_unavailable_raises_with_folder(tmp_path: Path, no_network) -> None:
    before = socket.getdefaulttimeout()
    with pytest.raises(DatasetUnavailableError) as info:
        resolve_dataset("mnist", tmp_path, download=True, log=pytest.fail)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert str(tmp_path / "MNIST" / "raw") in message
    assert "files missing, download failed" in message and "Name or service not known" in message
    assert no_network and all(t == 15.0 for t in no_network), "download ran under the short socket timeout"
    assert socket.getdefaulttimeout() == before, "socket timeout restored"


def test_mnist_without_download_raises(tmp_path: Path, no_network) -> None:
    with pytest.raises(DatasetUnavailableError, match="download disabled"):
        resolve_dataset("mnist", tmp_path, download=False)
    assert no_network == []  # download=False must not touch the network


def test_auto_falls_back_and_logs_once(tmp_path: Path, no_network) -> None:
    messages: list[str] = []
    info = resolve_dataset("auto", tmp_path, download=True, log=messages.append, offline_size=40, seed=2)
    assert info.name == "offline-digits" and len(info) == 40
    images, labels = synthetic_digits(40, seed=2)
    assert torch.equal(info.images, images) and torch.equal(info.labels, labels)
    assert len(messages) == 1
    message = messages[0]
    assert str(tmp_path / "MNIST" / "raw") in message
    assert "falling back" in message.lower() and "offline" in message
    assert "network" in message  # says how to get real MNIST

    with pytest.raises(DatasetUnavailableError):
        resolve_dataset("auto", tmp_path, allow_fallback=False, log=pytest.fail)


def test_auto_prints_by_default(tmp_path: Path, no_network, capsys: pytest.CaptureFixture[str]) -> None:
    resolve_dataset("auto", tmp_path, offline_size=10)
    out = capsys.readouterr().out
    assert out.count("Falling back") == 1 and str(tmp_path) in out


def test_auto_with_accelerator_releases_barrier_and_logs_on_main_only(tmp_path: Path, no_network) -> None:
    events: list[str] = []

    class FakeAccelerator:
        def __init__(self, is_main: bool) -> None:
            self.is_main_process = is_main

        @contextlib.contextmanager
        def main_process_first(self):
            events.append("enter")
            yield  # an exception thrown in here would skip "exit", i.e. the real barrier
            events.append("exit")

    messages: list[str] = []
    for is_main in (True, False):
        info = resolve_dataset(
            "auto", tmp_path, log=messages.append, accelerator=FakeAccelerator(is_main), offline_size=10
        )
        assert info.name == "offline-digits"
    assert events == ["enter", "exit", "enter", "exit"]
    assert len(messages) == 1


def test_auto_and_mnist_load_real_mnist(mnist_dir: Path, mnist_train, no_network) -> None:
    for name in ("auto", "mnist"):
        info = resolve_dataset(name, mnist_dir, download=True, log=pytest.fail)
        assert info.name == "mnist" and str(mnist_dir) in info.source
        assert torch.equal(info.images, mnist_train[0]) and torch.equal(info.labels, mnist_train[1])
    assert no_network == []  # files present: no download attempted


def test_digits_and_unknown_names(tmp_path: Path, no_network) -> None:
    info = resolve_dataset("digits", tmp_path, log=pytest.fail, offline_size=30, seed=4)
    assert info.name == "offline-digits"
    assert torch.equal(info.images, synthetic_digits(30, seed=4)[0])
    assert no_network == [] and not (tmp_path / "MNIST").exists()
    with pytest.raises(ValueError, match="cifar"):
        resolve_dataset("cifar", tmp_path)


def test_corrupt_files_fall_back(tmp_path: Path, no_network) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in gd.MNIST_FILES:
        (raw / name).write_bytes(b"\x00\x00\x08\x03 truncated")
    messages: list[str] = []
    assert resolve_dataset("auto", tmp_path, log=messages.append, offline_size=10).name == "offline-digits"
    assert len(messages) == 1 and "files present but unreadable" in messages[0]
