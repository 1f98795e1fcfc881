"""One writer per run folder: a lock on ``<run>/.lock``, held by the main process for the run's life (``fcntl.flock``;
on Windows ``msvcrt.locking`` of one byte past the record, since Windows byte locks also bar reading).

The system releases it however the holder exits (crash, SIGKILL), so a dead process's lock is never obeyed.
The file records the holder (host, pid, start time) for the message a second run gets; a holder that lets go
empties it, unless its run crashed (then ``ended`` says how): a record left there names a run that did not end
as planned. It is opened without following a link: a ``.lock`` that is a link (or a FIFO, a device) is refused
in one line, never truncated.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from ..errors import GanAccelError, RunFolderError
from .files import open_kept_file, process_alive, write_failure_reason
from .layout import LOCK
from .reading import read_text

# Not filelock: the versions our dependencies allow (>= 3.10; 3.13, 3.20.3 read) open it with O_TRUNC before locking:
# a refused run would erase the record naming the holder, a new run the killed run's record that restart.py reads,
# and before 3.20.1 they follow a link.
try:
    import fcntl
    msvcrt = None
except ImportError:  # Windows
    fcntl = None
    import msvcrt

WINDOWS_LOCKED_BYTE = 1 << 20  # far past the record (a few hundred bytes), which a refused run must still read


class RunLock:
    """An exclusive lock on a run folder; ``acquire`` raises :class:`RunFolderError` naming the holder."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / LOCK
        self._fd: int | None = None
        self.previous: dict | None = None  # the record a holder left that ended without letting go (killed)

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
        try:
            _lock(fd, exclusive=True)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunFolderError(
                f"run folder {self.path.parent} is in use by another run ({holder}): one run writes to a folder "
                "at a time; wait for it to finish, stop it, or choose another output_dir") from None
        self.previous = _record(_read(fd))  # the lock is ours: a holder named there is gone
        info = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        _write(fd, json.dumps(info).encode())
        self._fd = fd

    def release(self, error: BaseException | None = None) -> None:
        """Release the lock (the file stays: removing it could race with a run taking it). ``error``: what ended the
        run; one that is not an expected gan_accel error (a crash, a lost process, a second Ctrl-C) leaves the record
        with ``ended``, so the run counts as killed (:mod:`gan_accel.storage.restart`)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        ended = None if error is None or isinstance(error, GanAccelError) else type(error).__name__
        try:
            mine = _record(_read(fd))
            record = {**mine, "ended": ended} if ended and mine else self.previous  # a killed holder's record stays
            _write(fd, json.dumps(record).encode() if record else b"")  # until a run takes over the folder
        finally:
            try:
                _lock(fd, exclusive=False)
            finally:
                os.close(fd)

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _lock(fd: int, exclusive: bool) -> None:
    """Take the lock without waiting (OSError when another process holds it), or let it go."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_UN)
    else:
        os.lseek(fd, WINDOWS_LOCKED_BYTE, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK if exclusive else msvcrt.LK_UNLCK, 1)


def _read(fd: int) -> bytes:
    """The record, from the file's start (seek and read: os.pread is Unix-only)."""
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096)


def _write(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)


def _record(data: bytes) -> dict | None:
    try:
        info = json.loads(data.decode() or "null")
    except ValueError:
        return None
    return info if isinstance(info, dict) and info else None


def _read_holder(fd: int, tries: int = 20) -> str:
    """Who holds the lock, as the holder's record names it. A run that has just taken the lock may not have written
    its record yet (it empties the file first), so an empty or partial record is read again for up to a second."""
    for attempt in range(tries):
        try:
            info = _record(_read(fd))
        except OSError:
            info = None
        if info or attempt == tries - 1:
            break
        time.sleep(0.05)
    return f"pid {info.get('pid')} on {info.get('host')}, since {info.get('since')}" if info else "holder unknown"


def recorded_holder(folder: str | os.PathLike) -> dict | None:
    """Who ``<folder>/.lock`` names as its holder, read only (taking even a shared lock could turn a starting run
    away), with ``alive``: whether that process runs, None when it is on another host (it cannot be checked)."""
    try:
        holder = _record(read_text(Path(folder) / LOCK).encode())
    except (OSError, ValueError, GanAccelError):  # absent, unreadable, a FIFO or a huge file: no holder to name
        return None
    if holder is not None:
        pid = holder.get("pid")
        holder["alive"] = False if holder.get("ended") else (isinstance(pid, int) and pid > 0 and process_alive(pid)) \
            if holder.get("host") == socket.gethostname() else None
    return holder
