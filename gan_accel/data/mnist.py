"""MNIST as one uint8 tensor, and choosing a data set: MNIST, else (with a message) the offline digits."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..errors import GanAccelError
from .digits import synthetic_digits

PathLike = str | os.PathLike

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def load_mnist_uint8(data_dir: PathLike, train: bool = True, download: bool = True) -> tuple[Tensor, Tensor]:
    """Load MNIST with torchvision once; return images uint8 (N, 1, 28, 28) and labels int64 (N,).

    Raises whatever torchvision raises when the files are missing and cannot be downloaded.
    """
    from torchvision.datasets import MNIST  # local: torchvision import is slow and only needed here

    ds = MNIST(os.fspath(data_dir), train=train, download=download)
    # ``ds.data`` is already the decoded uint8 array; taking it directly skips the per-item PIL path.
    return ds.data.to(torch.uint8).unsqueeze(1).contiguous(), ds.targets.to(torch.int64)


class DatasetUnavailableError(GanAccelError, RuntimeError):
    """The requested data set could not be loaded (and no fallback was allowed)."""


@dataclass(frozen=True)
class DatasetInfo:
    """A resolved data set: ``name`` is "mnist" or "offline-digits"; ``source`` says where it came from."""

    name: str
    images: Tensor  # uint8 (N, 1, H, W)
    labels: Tensor  # int64 (N,)
    source: str

    def __len__(self) -> int:
        return self.images.shape[0]

    def __repr__(self) -> str:  # the default repr would print both tensors
        return f"DatasetInfo(name={self.name!r}, images={tuple(self.images.shape)}, source={self.source!r})"


@contextlib.contextmanager
def _socket_timeout(seconds: float | None) -> Iterator[None]:
    # torchvision's downloader uses urllib without a timeout; with a black-holed network each of its
    # mirrors could hang for minutes. A default socket timeout turns that into a quick failure.
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _short_reason(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(exc).__name__}: {text}"


def resolve_dataset(name: str, data_dir: PathLike, download: bool = True, allow_fallback: bool = True,
                    log: Callable[[str], Any] | None = print, *, accelerator: Any | None = None, train: bool = True,
                    offline_size: int = 60_000, seed: int = 0, download_timeout: float = 15.0) -> DatasetInfo:
    """Resolve ``name`` ("mnist", "auto" or "digits") to images and labels.

    "mnist": MNIST from ``data_dir`` (downloaded when missing and ``download``), else ``DatasetUnavailableError``.
    "auto": the same, but on failure logs one message and returns the offline digits (unless
    ``allow_fallback=False``). "digits": the offline set directly.
    With ``accelerator``, the main process loads (and downloads) first, the others then read the files.
    """
    key = name.lower()
    if key not in ("mnist", "auto", "digits"):
        raise ValueError(f"unknown dataset {name!r}: choose 'mnist', 'auto' or 'digits'")
    if key == "digits":
        return _offline(offline_size, seed)

    raw_dir = os.path.join(os.fspath(data_dir), "MNIST", "raw")
    first = accelerator.main_process_first() if accelerator is not None else contextlib.nullcontext()
    timeout = _socket_timeout(download_timeout) if download else contextlib.nullcontext()
    missing = [f for f in MNIST_FILES if not os.path.exists(os.path.join(raw_dir, f))]
    error: BaseException | None = None
    with first:
        # The error is caught *inside* main_process_first: letting it escape would skip the barrier
        # at the end of that block on the main process and leave the other processes waiting forever.
        try:
            with timeout:
                images, labels = load_mnist_uint8(data_dir, train=train, download=download)
        except (RuntimeError, OSError, EOFError, ValueError) as exc:
            # RuntimeError: torchvision's "not found" / all mirrors failed; OSError covers URLError,
            # timeouts and permissions; EOFError/ValueError: truncated or corrupt files.
            error = exc
    if error is None:
        return DatasetInfo("mnist", images, labels, source=raw_dir)

    state = f"files missing, download {'failed' if download else 'disabled'}" if missing else \
        "files present but unreadable"
    what = f"Could not load MNIST from {raw_dir} ({state}; {_short_reason(error)})."
    how = (f"To use real MNIST, put {', '.join(MNIST_FILES)} (or their .gz) in {raw_dir}, "
           "or run once with network access so it can be downloaded.")
    if key == "mnist" or not allow_fallback:
        raise DatasetUnavailableError(f"{what} {how} The built-in offline digits are dataset 'digits'.") from error
    if log is not None and (accelerator is None or accelerator.is_main_process):
        log(f"{what} Falling back to the built-in offline digit set (synthetic digits rendered from "
            f"Pillow's font; NOT MNIST, scores are not comparable). {how}")
    return _offline(offline_size, seed)


def _offline(n: int, seed: int) -> DatasetInfo:
    images, labels = synthetic_digits(n, seed=seed)
    return DatasetInfo("offline-digits", images, labels, source=f"gan_accel.data.synthetic_digits(n={n}, seed={seed})")
