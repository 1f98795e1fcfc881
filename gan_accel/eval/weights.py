"""Published weights files that evaluation needs (Inception's, VGG-16's): where each is looked for, the first-use
download into torch hub's cache, and the hash check of the cached copy on every use.

A :class:`WeightsFile` is found at ``weights_path``, else at ``$<its env>``, else in torch hub's cache
(``$TORCH_HOME/hub/checkpoints``), downloaded there first when it is missing (:meth:`WeightsFile.fetch`: kept only
once its SHA-256 matches). Every failure is one line naming the file, the folder to put it in and the variable.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import torch

from ..errors import GanAccelError

FETCH_TIMEOUT = 30.0  # seconds: the longest wait for a connection or for any bytes of the download
FETCH_LIMIT = 1800.0  # seconds: a whole download by default (91 MB at 50 kB/s); a server that trickles ends then
PathLike = Union[str, os.PathLike]
_VERIFIED: set[tuple] = set()  # (path, device, inode, size, mtime, hash) hashed this process


class WeightsUnavailable(GanAccelError, RuntimeError):
    """A pretrained feature network cannot be used here: its library or its weights file is missing or bad."""


@dataclass(frozen=True)
class WeightsFile:
    """One published weights file. ``name`` is how messages call it ("Inception"); ``sha256`` is its whole
    SHA-256, or the leading hex digits that are all its publisher gives (torch hub checks no more either);
    ``env`` names the variable that points at a local copy; ``size`` what the download costs, ``limit`` the most
    seconds it may take; ``error`` the :class:`WeightsUnavailable` subclass raised when it cannot be had."""

    name: str
    file: str
    url: str
    sha256: str
    env: str
    size: str
    error: type[WeightsUnavailable] = WeightsUnavailable
    limit: float = FETCH_LIMIT

    @property
    def cache_path(self) -> Path:
        """Where the download is kept: torch hub's cache, where torchvision and torch-fidelity keep theirs."""
        return Path(torch.hub.get_dir()) / "checkpoints" / self.file

    def resolve(self, weights_path: PathLike | None = None, download: bool = True) -> Path:
        """The local file: ``weights_path``, else ``$env``, else the cache (verified), downloaded there first
        when it is missing and ``download`` is true."""
        env = os.environ.get(self.env, "").strip()
        if weights_path is not None or env:
            path = Path(weights_path if weights_path is not None else env).expanduser()
            if not path.is_file():
                from ..storage.reading import not_regular

                given = "" if weights_path is not None else f" (from ${self.env})"
                fix = "pass weights_path=" if weights_path is not None else f"point {self.env} at"
                # something that stands there (a FIFO, a folder, a link to a device) is named as what it is
                what = f"is {not_regular(path.stat().st_mode)}" if path.exists() else "does not exist"
                raise self.error(f"{self.name} weights file {path}{given} {what}; {fix} a local copy of {self.file}")
            return path
        cached = self.cache_path
        if os.path.lexists(cached):  # anything standing there is judged, never downloaded over
            return self.verify(cached)
        if not download:
            raise self.error(f"{self.name} weights {self.file} are not in {cached.parent} (downloads are off); get "
                             f"them from {self.url} and put them there, or point {self.env} at a copy")
        return self.fetch(cached, sha256_prefix=self.sha256)

    def verify(self, path: Path) -> Path:
        """``path``, a download kept in the cache, once it is a regular file whose SHA-256 matches: hashed once per
        process (and again when the file changes); checked to be the same file on every use. Anything else is
        one line that names it as corrupt and says to delete it."""
        from ..errors import UnsafeFileError
        from ..storage.pickles import pickled_call
        from ..storage.reading import file_sha256, not_regular

        fix = (f"delete it (rm {'-r ' if path.is_dir() and not path.is_symlink() else ''}{path}) and run again to "
               f"download it again, or put a good copy from {self.url} there")
        corrupt = f"the cached {self.name} weights {path} are corrupt"
        try:
            info = os.stat(path)
        except OSError as error:
            raise self.error(f"{corrupt} (a link to nothing: {os.strerror(error.errno)}); {fix}") from None
        kind = not_regular(info.st_mode)
        if kind:
            raise self.error(f"{corrupt} ({kind}); {fix}")
        key = (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, self.sha256)
        if key in _VERIFIED:
            return path
        try:
            digest = file_sha256(path)
        except (OSError, UnsafeFileError) as error:
            raise self.error(f"the cached {self.name} weights {path} cannot be read ({error}); {fix}") from None
        if not digest.startswith(self.sha256):
            call = pickled_call(path)  # read without running it: only a file that names a callable could run code
            what = (f"it is not the file: it holds pickled code (GLOBAL {call}) that could run if loaded" if call
                    else f"{info.st_size:,} bytes whose SHA-256 starts {digest[:8]}, not {self.sha256[:8]}: "
                         "truncated or damaged")
            raise self.error(f"{corrupt} ({what}); {fix}")
        _VERIFIED.add(key)
        return path

    def fetch(self, dest: PathLike, url: str | None = None, sha256_prefix: str | None = None,
              timeout: float | None = None, limit: float | None = None, progress: bool | None = None) -> Path:
        """Download ``url`` (default: the file's) to ``dest`` with a progress bar, and return ``dest``.

        The bytes go to a temporary file beside ``dest``, renamed to ``dest`` only once their SHA-256 starts with
        ``sha256_prefix`` (default: torch hub's convention, the hex digits after the last ``-`` of ``dest``'s name),
        so a partial or wrong file is never kept. ``timeout`` bounds each wait for the server (default
        :data:`FETCH_TIMEOUT`), ``limit`` the whole download (default: the file's). The bar shows on the local main
        process only (``progress=None``). Any failure is one line naming the file, where to put it by hand and
        the variable.
        """
        from ..storage.files import atomic_path, first_line

        dest, url = Path(dest), url or self.url
        timeout = FETCH_TIMEOUT if timeout is None else timeout
        limit = self.limit if limit is None else limit
        progress = os.environ.get("LOCAL_RANK", "0") == "0" if progress is None else progress
        named = re.fullmatch(r".*-([0-9a-f]{8,})\.\w+", dest.name)
        expected = sha256_prefix or (named.group(1) if named else None)
        if not expected:
            raise ValueError(f"no sha256_prefix given and none in the name {dest.name!r} (NAME-<hex digits>.EXT)")
        # Not torch.hub.download_url_to_file: no timeout (only the process-wide socket default, which bounds other
        # threads' sockets too), blocking 128 KiB reads with no hook, so a trickle runs past any limit (51 s for 16 KiB
        # against 0.5 s), and a body cut short ends silently (http.client), read as a wrong hash, not "500 of 1000".
        started = time.monotonic()
        try:
            _clear_stale_downloads(dest, 3 * timeout)
            with urllib.request.urlopen(url, timeout=timeout) as response, atomic_path(dest) as tmp:
                if progress:
                    print(f"gan_accel: first use of {self.name} features: downloading {dest.name} ({self.size}, once) "
                          f"into {dest.parent}", file=sys.stderr, flush=True)
                total = int(response.headers.get("Content-Length") or 0) or None
                digest, received = hashlib.sha256(), 0
                with open(tmp, "wb") as out, _bar(total, dest.name, progress) as bar:
                    while chunk := response.read1(1 << 20):  # what has arrived: a trickle still meets the limit
                        if time.monotonic() - started > limit:
                            raise TimeoutError(f"the download took longer than {limit:g} s")
                        out.write(chunk)
                        digest.update(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
                if total is not None and received != total:
                    raise ConnectionError(f"the connection closed after {received} of {total} bytes")
                if not digest.hexdigest().startswith(expected):
                    raise ValueError(f"the file's SHA-256 starts {digest.hexdigest()[:len(expected)]}, not {expected} "
                                     "as its name says: refused")
        except (OSError, http.client.HTTPException, ValueError) as error:
            reason = getattr(error, "reason", None) if isinstance(error, urllib.error.URLError) else error
            if isinstance(error, urllib.error.HTTPError):
                reason = f"HTTP {error.code} {error.reason}"
            elif isinstance(reason, TimeoutError) and str(reason) in ("", "timed out"):  # the socket's own words
                reason = f"no answer within {timeout:g} s"
            elif isinstance(reason, socket.gaierror):
                host = urllib.parse.urlsplit(url).hostname
                reason = f"cannot look up {host}: {reason.strerror}; is this machine offline?"
            reason = " ".join(first_line(reason).split()) if isinstance(reason, BaseException) else str(reason)
            raise self.error(
                f"cannot download the {self.name} weights {dest.name} from {url} ({reason}); download that file by "
                f"hand and put it in {dest.parent}, or point {self.env} at your copy") from None
        return dest


def _bar(total: int | None, name: str, show: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="B", unit_scale=True, unit_divisor=1024, disable=not show,
                file=sys.stderr, dynamic_ncols=True)


def _clear_stale_downloads(dest: Path, age: float) -> None:
    """Remove what a killed download left beside ``dest``: a live download writes at least every ``timeout``."""
    for stale in dest.parent.glob(f".{dest.name}.*.tmp"):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove: it is never read
            if time.time() - stale.stat().st_mtime > age:
                stale.unlink()
