"""One process per machine builds (scans, decodes into the cache) while the others of its machine wait.

Under ``accelerate launch`` the first process (by rank) of each machine runs the build; the others wait
for a status file, not a collective (a large build can outlast the process group's timeout). Then
every process raises the builder's error, if any, so no process is left waiting. A builder that dies
during the build (killed, out of memory) is named by the first process that waited for it, in one line;
that process then exits 75, as for any other process that went silent (:mod:`gan_accel.processes`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import GanAccelError, UnsafeFileError
from ..processes import EXIT_SILENT_PEER, raise_together
from ..storage.files import process_alive, write_bytes_synced
from ..storage.reading import read_json
from .image_cache import cache_error


class Builder(NamedTuple):
    """Who builds on this machine: whether this process does, a token naming the call (the same on every process),
    the builder's rank and process id, and whether this process is the one that names a dead builder."""

    is_builder: bool
    token: str
    rank: int = 0
    pid: int = 0
    speaker: bool = False


def builder_of(accelerator: Any) -> Builder:
    """Who builds on this machine (collective; see :class:`Builder`).

    Machines are told apart by host name (LOCAL_RANK cannot say it: some launchers, accelerate's debug
    launcher among them, leave it 0 on every process). The token is the first process's.
    """
    if accelerator is None or accelerator.num_processes == 1:
        return Builder(True, "")
    import socket
    import uuid

    from accelerate.utils import gather_object

    reports = gather_object([(socket.gethostname(), uuid.uuid4().hex, os.getpid())])
    hosts = [host for host, _, _ in reports]
    rank = accelerator.process_index
    first = hosts.index(hosts[rank])
    waiters = [r for r, host in enumerate(hosts) if host == hosts[rank] and r != first]
    return Builder(first == rank, reports[0][1], first, reports[first][2], bool(waiters) and waiters[0] == rank)


def build_once(accelerator: Any, builder: Builder, step: str, build: Callable[[], None], root: Path) -> None:
    """Run ``build`` on the builder while the other processes of its machine wait; every process then raises
    the builder's error (a file-system error as one line naming the cache ``root``; a bug is raised too)."""
    is_builder, token = builder[:2]
    multi = accelerator is not None and accelerator.num_processes > 1
    error: BaseException | None = None
    if is_builder:
        try:
            build()
        except (GanAccelError, OSError) as caught:
            error = caught if isinstance(caught, GanAccelError) else cache_error(caught, root)
        except Exception as caught:  # a bug: the other processes must not wait for the build forever
            if not multi:
                raise
            error = caught
    if not multi:
        if error is not None:
            raise error
        return
    # In the machine's temporary folder: per machine, like the builder, and writable even when the
    # cache folder is not (then the builder's error must still reach the others).
    status = Path(tempfile.gettempdir()) / f"gan_accel-image-{step}-{token}.status"
    if is_builder:
        write_bytes_synced(status, json.dumps({"state": "error" if error is not None else "done"}).encode())
    else:
        _wait_for(status, builder)
    try:
        raise_together(accelerator, error)  # every process raises the builder's error, if any
    finally:
        if is_builder:  # every process of this machine has read it: they are all in raise_together
            status.unlink(missing_ok=True)


def _wait_for(path: Path, builder: Builder) -> None:
    """Wait until the builder of this machine has written its status file; if it dies first (or the launcher
    stops this process after it died), say so in one line and exit."""
    stopped = threading.Event()
    restore = None
    if threading.current_thread() is threading.main_thread():  # the launcher's SIGTERM, once the builder died
        restore = signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
    try:
        while True:
            with contextlib.suppress(OSError, ValueError, AttributeError, UnsafeFileError):  # unwritten, or not ours
                if read_json(path).get("state") in ("done", "error"):
                    return
            if not process_alive(builder.pid) or stopped.is_set():
                break
            time.sleep(0.2)
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
    deadline = time.monotonic() + 3.0  # a stop that is not the builder's death: the builder is reaped first
    while process_alive(builder.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_alive(builder.pid):
        os.kill(os.getpid(), signal.SIGTERM)  # stopped for another reason: end as the signal asks
    if builder.speaker:
        print(f"gan_accel: error: process {builder.rank}, building this machine's image cache, ended before it was "
              "done (killed, or out of memory?); stopping before training started: launch again to build it",
              file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_SILENT_PEER)  # the process group cannot be torn down with a process gone


