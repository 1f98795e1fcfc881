"""One writer per run folder: ``fcntl.flock`` on ``<run>/.lock``, held by the main process for the run's life.

The kernel releases it however the holder exits (crash, SIGKILL), so a dead process's lock is never obeyed.
The file records the holder (host, pid, start time) for the message a second run gets. It is opened without
following a link: a ``.lock`` that is a link (or a FIFO, a device) is refused in one line, never truncated.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from ..errors import RunFolderError
from .files import open_kept_file, write_failure_reason
from .layout import LOCK

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the folder check still refuses finished runs
    fcntl = None


class RunLock:
    """An exclusive lock on a run folder; ``acquire`` raises :class:`RunFolderError` naming the holder."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / LOCK
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_kept_file(self.path, os.O_RDWR, "the run's lock")
        except OSError as error:  # the first write of a run: an unusable folder stops it before any work
            raise RunFolderError(f"cannot use output folder {self.path.parent}: {write_failure_reason(error)} "
                                 f"(at {error.filename}); choose a writable output_dir") from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunFolderError(
                    f"run folder {self.path.parent} is in use by another run ({holder}): one run writes to a folder "
                    "at a time; wait for it to finish, stop it, or choose another output_dir") from None
        info = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (the file stays: removing it could race with a run taking it)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "holder unknown"
    return f"pid {info.get('pid')} on {info.get('host')}, since {info.get('since')}"
