"""One process per machine builds (scans, decodes into the cache) while the others of its machine wait.

Under ``accelerate launch`` the first process (by rank) of each machine runs the build; the others wait
for a status file, not a collective (a large build can outlast the process group's timeout). Then
every process raises the builder's error, if any, so no process is left waiting.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import GanAccelError
from ..state.files import write_bytes_synced
from .image_cache import cache_error


def builder_of(accelerator: Any) -> tuple[bool, str]:
    """Whether this process builds, and a token naming this call on every process (collective).

    Machines are told apart by host name (LOCAL_RANK cannot say it: some launchers, accelerate's debug
    launcher among them, leave it 0 on every process). The token is the first process's.
    """
    if accelerator is None or accelerator.num_processes == 1:
        return True, ""
    import socket
    import uuid

    from accelerate.utils import gather_object

    reports = gather_object([(socket.gethostname(), uuid.uuid4().hex)])
    hosts = [host for host, _ in reports]
    rank = accelerator.process_index
    return hosts.index(hosts[rank]) == rank, reports[0][1]


def build_once(accelerator: Any, builder: tuple[bool, str], step: str, build: Callable[[], None], root: Path) -> None:
    """Run ``build`` on the builder while the other processes of its machine wait; every process then raises
    the builder's error (a file-system error as one line naming the cache ``root``; a bug is raised too)."""
    is_builder, token = builder
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
    from ..ending import raise_together

    # In the machine's temporary folder: per machine, like the builder, and writable even when the
    # cache folder is not (then the builder's error must still reach the others).
    status = Path(tempfile.gettempdir()) / f"gan_accel-image-{step}-{token}.status"
    if is_builder:
        write_bytes_synced(status, json.dumps({"state": "error" if error is not None else "done"}).encode())
    else:
        _wait_for(status)
    try:
        raise_together(accelerator, error)  # every process raises the builder's error, if any
    finally:
        if is_builder:  # every process of this machine has read it: they are all in raise_together
            status.unlink(missing_ok=True)


def _wait_for(path: Path) -> None:
    """Wait until the builder of this machine has written its status file."""
    while True:
        try:
            if json.loads(path.read_text()).get("state") in ("done", "error"):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
