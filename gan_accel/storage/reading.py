"""The one reader of the files gan_accel reads from a run, a checkpoint, an export or a cache.

Every such file is opened without blocking (a FIFO standing there cannot hang the reader), checked on the open
descriptor to be a regular file (not a FIFO, device, socket or folder) of at most a bound for its kind, and only
then read; a file that a library opens by name (safetensors, torch, numpy) is checked the same way just before.
A link to a regular file is read as that file. A refusal is one line naming the file
(:class:`~gan_accel.errors.UnsafeFileError`); a missing file stays ``FileNotFoundError``, which callers expect.
``tests/test_one_reader.py`` fails when a raw read of a file appears anywhere else in the package.
"""

from __future__ import annotations

import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

from ..errors import UnsafeFileError

# The bounds, far above what gan_accel writes and far below what would exhaust memory by being read.
MAX_JSON_BYTES = 64 << 20  # config.json, data.json, COMPLETE, best.json, the lock, a cache's record, ...
MAX_LOG_BYTES = 1 << 30  # metrics.jsonl and history.jsonl grow with the run: a million rows fit
MAX_IMAGE_BYTES = 512 << 20  # a picture the run wrote (a progress grid read back for the GIF)
MAX_TENSOR_BYTES = 64 << 30  # weights, checkpoint states, cached arrays and features (mapped, or read whole)

NON_BLOCKING = getattr(os, "O_NONBLOCK", 0)
NO_TERMINAL = getattr(os, "O_NOCTTY", 0)  # opening a terminal device must not make it this process's terminal
CLOSE_ON_EXEC = getattr(os, "O_CLOEXEC", 0)
BINARY = getattr(os, "O_BINARY", 0)  # Windows: the bytes as they are, not text mode (which stops at a Ctrl-Z)

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


class RefusedFile(OSError):
    """A file refused before it is read; its message is the reason alone ("not a regular file: a FIFO")."""


def not_regular(mode: int) -> str:
    """Why a file of this ``st_mode`` is refused ("not a regular file: a FIFO"), or "" for a regular file."""
    if stat.S_ISREG(mode):
        return ""
    kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
    return f"not a regular file: {kind}"


def open_checked(path: str | os.PathLike, limit: int, what: str = "such a file") -> IO[bytes]:
    """``path`` opened for reading when it is a regular file of at most ``limit`` bytes; raises
    :class:`RefusedFile` (the reason alone) otherwise, or ``OSError`` when it cannot be opened. Checked before
    opening (a device may act on open) and on the open descriptor (the file may have been swapped meanwhile)."""

    def check(info: os.stat_result) -> None:
        reason = not_regular(info.st_mode)
        if not reason and info.st_size > limit:
            reason = f"too large: {info.st_size:,} bytes, more than the {limit:,} {what} may have"
        if reason:
            raise RefusedFile(reason)

    check(os.stat(path))
    fd = os.open(path, os.O_RDONLY | NON_BLOCKING | NO_TERMINAL | CLOSE_ON_EXEC | BINARY)  # a FIFO swapped in: no hang
    try:
        check(os.fstat(fd))
    except RefusedFile:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def refusal(path: str | os.PathLike, reason: str) -> UnsafeFileError:
    """The one line for a file of the run that is refused before it is read."""
    if reason.startswith("not a regular file"):
        kind = reason.partition(": ")[2] or "not a plain file"
        return UnsafeFileError(f"{path} is not a regular file ({kind}): gan_accel reads only regular files; "
                               "replace it with the file it stands for")
    return UnsafeFileError(f"{path} is {reason}: it is not a file gan_accel wrote; replace or remove it")


def open_file(path: str | os.PathLike, limit: int) -> IO[bytes]:
    """:func:`open_checked` with a refusal as :class:`UnsafeFileError` naming the file; ``OSError`` otherwise."""
    try:
        return open_checked(path, limit)
    except RefusedFile as refused:
        raise refusal(path, str(refused)) from None


def check_regular_file(path: str | os.PathLike, limit: int = MAX_TENSOR_BYTES) -> None:
    """Refuse, in one line (:class:`UnsafeFileError`), a path that is not a regular file of at most ``limit``
    bytes, or cannot be opened: for a file a library then opens by name."""
    try:
        open_file(path, limit).close()
    except OSError as error:
        raise UnsafeFileError(f"cannot read {path}: {os.strerror(error.errno) if error.errno else error}") from None


def read_bytes(path: str | os.PathLike, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (see the module docstring)."""
    with open_file(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # it grew after the check
        raise refusal(path, f"too large: more than the {limit:,} bytes such a file may have")
    return data


def read_text(path: str | os.PathLike, limit: int = MAX_JSON_BYTES, errors: str = "strict") -> str:
    """The text (UTF-8) of a regular file of at most ``limit`` bytes."""
    return read_bytes(path, limit).decode("utf-8", errors=errors)


def read_json(path: str | os.PathLike, limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file of the run (config.json, best.json, ...). Raises ``OSError`` (missing, unreadable), ``ValueError``
    (not JSON), :class:`UnsafeFileError` (not a regular file, or too large)."""
    try:
        return json.loads(read_bytes(path, limit))
    except RecursionError:  # nested deeper than the parser goes: not a file gan_accel wrote
        raise ValueError(f"{path} is nested too deeply to be one of gan_accel's JSON files") from None


def file_sha256(path: str | os.PathLike, limit: int = MAX_TENSOR_BYTES) -> str:
    """The SHA-256 of a regular file of at most ``limit`` bytes, read in chunks (bounded memory)."""
    import hashlib

    digest = hashlib.sha256()
    with open_file(path, limit) as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- files a library reads by name: checked first ------------------------------------------------------------
def load_safetensors(path: str | os.PathLike) -> dict[str, Any]:
    """Every tensor of a safetensors file (on the CPU)."""
    from safetensors.torch import load_file

    check_regular_file(path)
    return load_file(str(path))


@contextmanager
def open_safetensors(path: str | os.PathLike) -> Iterator[Any]:
    """safetensors' ``safe_open`` of a checked file (its header and tensors read on demand)."""
    from safetensors import safe_open

    check_regular_file(path)
    with safe_open(str(path), framework="pt") as handle:
        yield handle


def load_weights_only(path: str | os.PathLike, mmap: bool = False) -> Any:
    """``torch.load(weights_only=True)`` of a checked file onto the CPU (no code runs; see ``pickles``)."""
    import torch

    check_regular_file(path)
    return torch.load(Path(path), map_location="cpu", weights_only=True, mmap=mmap)


def load_array(path: str | os.PathLike, mmap: bool = False) -> Any:
    """A numpy array of a checked ``.npy`` file, never unpickled; ``mmap``: mapped read-only."""
    import numpy as np

    check_regular_file(path)
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
