"""Atomic file writes (a reader or a resumed run never sees half a file), and write failures in words.

Nothing is written, truncated or deleted through a symbolic link: a file gan_accel creates is created anew
(``O_EXCL | O_NOFOLLOW``: never opened through a link someone left under its name), a file it keeps open (the
lock, the logs) is opened with ``O_NOFOLLOW`` and refused in one line when a link stands there, a rename
replaces a link itself, and a removal unlinks a link itself, never what it points to.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import psutil

from ..errors import ConfigError, RunFolderError
from .reading import BINARY, CLOSE_ON_EXEC, NON_BLOCKING  # opening a FIFO must not wait for a writer

NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # 0 on Windows, whose links need privileges to make


def temporary_name(path: Path) -> Path:
    """A hidden name beside ``path`` for writing it before the rename: host and process in it, so that
    concurrent writers, even on a folder shared between machines, never clash."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs: not gone and not a zombie awaiting its parent (another
    user's counts as running: it may be a writer; a pid <= 0 is never judged dead). Through psutil, not
    ``os.kill(pid, 0)``: on Windows that sends a Ctrl-C to the process instead of asking about it."""
    if pid <= 0:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # access denied and the like: it exists
        return True


def clear_dead_temporaries(path: Path, every_name: bool = False) -> list[Path]:
    """Remove what writers of ``path`` on this host that were killed (SIGKILL, out of memory) left beside it: its
    :func:`temporary_name` with the id of a process no longer running, a file or a folder (an export's), removed
    as a name, never through a link. ``every_name``: the temporary files of every name in the folder ``path``
    (and their ``.compact`` copies). A live writer's, another host's and anything else are kept. Returns what was
    removed."""
    folder, host, removed = (path if every_name else path.parent), re.escape(socket.gethostname()), []
    stem = rf"(?=\.).*\.{host}" if every_name else rf"\.{re.escape(path.name)}\.{host}"  # see temporary_name
    temporary = re.compile(stem + r"\.(\d+)\.tmp" + (r"(\.compact)?" if every_name else ""), re.DOTALL)
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = temporary.fullmatch(name)
        if match is None or int(match[1]) == os.getpid() or process_alive(int(match[1])):
            continue
        with contextlib.suppress(OSError):  # another process cleared it first, or it is not ours: it is never read
            (os.unlink if every_name else remove_tree)(folder / name)
            removed.append(folder / name)
    return removed


def rename_new(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` in one step that refuses (``FileExistsError``) when anything stands at ``dst``
    (Linux's ``renameat2(RENAME_NOREPLACE)``); elsewhere ``dst`` is claimed by creating it first, which leaves a
    moment in which a killed process leaves an empty ``dst`` behind."""
    try:
        import ctypes

        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28
        renameat2 = None
    if renameat2 is not None:
        at_cwd, no_replace = -100, 1  # AT_FDCWD, RENAME_NOREPLACE
        if renameat2(at_cwd, os.fsencode(src), at_cwd, os.fsencode(dst), no_replace) == 0:
            return
        number = ctypes.get_errno()
        if number not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # a file system without the flag
            raise OSError(number, os.strerror(number), str(dst))
    if src.is_dir():
        dst.mkdir()  # the claim: FileExistsError when taken; the rename replaces only this empty folder
    elif os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def create_new(path: str | os.PathLike, mode: int = 0o666) -> int:
    """A descriptor of a file created at ``path`` for writing; refused (``FileExistsError``) when anything, a link
    included, stands there. The mode is ``mode`` less the umask, as for any file the user creates."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW | CLOSE_ON_EXEC | BINARY, mode)


def open_kept_file(path: str | os.PathLike, flags: int, what: str) -> int:
    """A descriptor of a file of the run that is opened in place (the lock, an appended log), created when absent.
    A link, a FIFO, a device or a folder there is refused with :class:`RunFolderError` in one line: writing through
    it would change a file outside the run (or wait forever on a FIFO)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | NO_FOLLOW | NON_BLOCKING | CLOSE_ON_EXEC | BINARY, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP or os.path.islink(path):
            raise RunFolderError(f"{path} is a symbolic link, and gan_accel never writes {what} through a link (it "
                                 "would change a file outside the run): remove the link, then run again") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFolderError(f"{path} is not a regular file (a FIFO, device or folder stands where {what} goes): "
                             "remove it, then run again")
    return fd


def remove_entry(path: str | os.PathLike) -> None:
    """Remove the file or link ``path`` (a link itself, never its target); an absent one is no error."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_tree(path: str | os.PathLike) -> None:
    """Remove the folder ``path`` and what it holds; a link is unlinked itself, and a link inside is never
    descended into (``shutil.rmtree`` removes links as links)."""
    if os.path.islink(path) or not os.path.isdir(path):
        remove_entry(path)
    else:
        shutil.rmtree(path)


def has_link_between(root: str | os.PathLike, relative: str | os.PathLike) -> bool:
    """Whether any part of ``root/relative`` below ``root`` is a symbolic link (so that it may lead out of
    ``root``); an absent part ends the walk (nothing there to follow)."""
    parts = Path(relative).parts  # os.path.islink: False for an absent part, and for everything under it
    return any(os.path.islink(Path(root, *parts[:end])) for end in range(1, len(parts) + 1))


def make_own_folder(path: str | os.PathLike, what: str) -> Path:
    """Create the folder ``path`` of the run (parents too) when absent; refuse, in one line, a link standing there
    (the run would write its files into the folder it points to, outside the run)."""
    path = Path(path)
    if path.is_symlink():
        raise RunFolderError(f"{path} is a symbolic link, and gan_accel never writes {what} through a link (they "
                             "would land outside the run): remove the link, then run again")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``, renamed over ``path`` on success (atomic), removed on failure.
    The temporary file is created here, anew (a link left under its name is removed first, never followed), so
    whatever the caller writes lands in it; the rename replaces a link at ``path`` itself, not its target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_dead_temporaries(path)
    tmp = temporary_name(path)
    remove_entry(tmp)  # a killed writer's leftover of this process id, or a link: its name, never its target
    os.close(create_new(tmp))
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def first_line(error: BaseException) -> str:
    """An error's message, its first line (at most 300 characters), or its type when it has none."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def write_bytes_synced(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` atomically and flush it to disk; a failure raises ``OSError`` with its errno."""
    with atomic_path(path) as tmp, open(tmp, "r+b") as handle:  # atomic_path's own file: opening it creates nothing
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


_ERRNO_IN_TEXT = re.compile(r"(?:os error|errno)\s*(\d+)", re.IGNORECASE)
_TORCH_ENFORCE = re.compile(r"\[enforce fail at [^\]]*\]\s*\.?\s*")  # torch's C++ prefix, no use to a reader
LOW_SPACE = 64 * 2**20  # bytes: less free space than this where a write failed is the likely reason


def write_failure_reason(error: BaseException, path: str | os.PathLike | None = None) -> str:
    """The reason a write failed, in words: ``"File too large (EFBIG)"``. Torch's zip writer gives no errno
    (``unexpected pos 704 vs 598`` on a full disk), so then the free space at ``path`` and the usual limits are named.
    """
    number = getattr(error, "errno", None)
    if number is None:
        match = _ERRNO_IN_TEXT.search(str(error))
        number = int(match.group(1)) if match else None
    if number is not None:
        return f"{os.strerror(number)} ({errno.errorcode.get(number, number)})"
    first = first_line(error)
    if _TORCH_ENFORCE.match(first):
        first = f"torch's file writer stopped part-way ({_TORCH_ENFORCE.sub('', first).strip() or 'no reason given'})"
    free = free_space(path)
    if free is not None and free < LOW_SPACE:
        return f"{os.strerror(errno.ENOSPC)} (ENOSPC): {free:,} bytes free on the file system of {path} ({first})"
    hints = [] if free is None else [f"{free:,} bytes free there"]
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            hints.append(f"this process has a file-size limit of {limit} bytes (ulimit -f)")
    return f"{first}" + (f"; {'; '.join(hints)}" if hints else "") + "; check free space, quotas and file-size limits"


def free_space(path: str | os.PathLike | None) -> int | None:
    """Bytes free to this user on the file system of ``path`` (its nearest existing folder), or None."""
    if path is None:
        return None
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        stats = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def is_write_failure(error: BaseException) -> bool:
    """Whether ``error`` is the file system refusing a write (not a bug in the caller)."""
    if isinstance(error, OSError):
        return True
    text = str(error)
    return bool(_ERRNO_IN_TEXT.search(text)) or "PytorchStreamWriter" in text or "file write failed" in text \
        or "unexpected pos" in text or "inline_container" in text


def cannot_write(out: Path, error: BaseException, flag: str) -> ConfigError:
    """The one line for an output a command cannot write."""
    return ConfigError(f"{flag} {out}: cannot write it: {write_failure_reason(error)}; choose another path (a folder "
                       "you can write to, with free space)")


def write_new_folder(out: Path, fill: Callable[[Path], None], flag: str = "--out") -> None:
    """Create the folder ``out`` holding what ``fill(folder)`` writes: complete or not at all, never over anything.
    The files go to a hidden temporary folder beside it, renamed to ``out`` in one step that refuses an ``out``
    that appeared meanwhile (:func:`rename_new`). Interrupted, it removes that folder; killed, it leaves only the
    folder, which the next write of ``out`` on this host removes: never an ``out`` that refuses the retry."""
    exists = f"{flag} {out} exists, and gan-accel never replaces anything; choose a new path"
    if os.path.lexists(out):
        raise ConfigError(exists)
    clear_dead_temporaries(out)
    tmp = temporary_name(out)
    made = False
    try:
        try:
            remove_tree(tmp)  # a killed export of this process id, or a link: never what a link points to
            tmp.mkdir()
            made = True
            fill(tmp)
        except Exception as error:  # safetensors' writer reports a full disk as its own error, not an OSError
            if not is_write_failure(error):
                raise
            raise cannot_write(out, error, flag) from error
        try:
            rename_new(tmp, out)
        except FileExistsError:
            raise ConfigError(f"{exists} (it appeared while gan-accel wrote; nothing was written over it)") from None
        except OSError as error:
            raise cannot_write(out, error, flag) from error
    except BaseException:
        if made:  # only the folder made here, and what was written into it
            remove_tree(tmp)
        raise
