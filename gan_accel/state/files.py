"""Atomic file writes (a reader or a resumed run never sees half a file), and write failures in words."""

from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed over ``path`` (atomic on one filesystem).

    The temporary name carries the process id, so concurrent writers never clash; it is removed if
    the write fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_synced(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` atomically and flush it to disk; a failure raises ``OSError`` with its errno.

    Used instead of ``torch.save(obj, path)``, whose zip writer reports a full disk or a file-size
    limit as an opaque ``RuntimeError``.
    """
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def torch_bytes(obj: object) -> bytes:
    """``torch.save`` into memory (see :func:`write_bytes_synced`)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


_ERRNO_IN_TEXT = re.compile(r"(?:os error|errno)\s*(\d+)", re.IGNORECASE)


def write_failure_reason(error: BaseException) -> str:
    """The reason a write failed, in words: ``"File too large (EFBIG)"``.

    ``OSError`` carries its errno; safetensors puts it in its message ("os error 27"); torch's zip
    writer gives none, so the limits that usually explain it (file-size limit, free space) are named.
    """
    number = getattr(error, "errno", None)
    if number is None:
        match = _ERRNO_IN_TEXT.search(str(error))
        number = int(match.group(1)) if match else None
    if number is not None:
        return f"{os.strerror(number)} ({errno.errorcode.get(number, number)})"
    hints = []
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            hints.append(f"this process has a file-size limit of {limit} bytes (ulimit -f)")
    except (ImportError, OSError, ValueError):
        pass
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{first}" + (f"; {'; '.join(hints)}" if hints else "; check free space, quotas and file-size limits")


def is_write_failure(error: BaseException) -> bool:
    """Whether ``error`` is the file system refusing a write (not a bug in the caller)."""
    if isinstance(error, OSError):
        return True
    text = str(error)
    return bool(_ERRNO_IN_TEXT.search(text)) or "PytorchStreamWriter" in text or "file write failed" in text \
        or "unexpected pos" in text
