"""Who has stopped answering, judged from heartbeat counters on this process's own clock.

Pure logic: no threads, no store, no torch. :mod:`gan_accel.watchdog.service` feeds it what it reads
from the store and the signals it sees, and does what :meth:`Judge.verdict` says.

Why heartbeats and not a plain timeout on collectives: a long wait is not a dead peer. The main
process alone may score an evaluation, write a large checkpoint or build a data cache while the
others wait in a barrier. Every process bumps its own counter from a thread, busy or not, so a
counter that has stopped moving means the process is stopped (SIGSTOP, a debugger), dead, its host
unreachable, or hung so badly that even a second thread cannot run.

Times are compared on the watcher's own clock only (no clock of another host is ever read), and
that clock skips the time this process itself was frozen (:class:`SteadyClock`): a process that was
stopped and continued must not blame its peers for the time it slept.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

#: Two deliveries of a stop signal closer than this (seconds) are one request. Launchers deliver a
#: Ctrl-C twice within milliseconds: one that forwards SIGINT to workers that also got it from the
#: terminal; ``torch.multiprocessing.spawn`` terminating its children after its own Ctrl-C;
#: ``accelerate launch`` / ``torchrun`` sending SIGTERM after SIGINT when its own second signal
#: arrives while it forwards the first. A person's second press comes later.
DUPLICATE_SIGNAL_WINDOW = 0.25

#: After a signal, a peer silent this long (or ``timeout``, if shorter) is taken as the reason the
#: process cannot stop gracefully: the graceful stop needs every process for one more step.
SIGNAL_GRACE = 5.0

#: After a second signal, the main thread has this long to end the process itself (its
#: ``KeyboardInterrupt`` unwinds through the callbacks); then the watchdog ends it.
SECOND_SIGNAL_GRACE = 2.0

#: ... and this long once the main thread has said it is ending the process (it printed why): only
#: a hang on the way out (a barrier, a file close) keeps it from ending by itself.
ENDING_GRACE = 10.0


class SteadyClock:
    """Monotonic seconds that count at most ``max_step`` for any gap between two readings.

    The watchdog reads it at least every fraction of a second, so a longer gap means this process
    itself did not run (stopped and continued, its VM paused, or starved): that time is not counted,
    so nobody is blamed for it. Thread-safe.
    """

    def __init__(self, max_step: float, real: Callable[[], float] = time.monotonic) -> None:
        self.max_step = max_step
        self._real = real
        self._last = real()
        self._value = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            current = self._real()
            self._value += min(max(current - self._last, 0.0), self.max_step)
            self._last = current
            return self._value


@dataclass
class Peer:
    """What this process knows of another one."""

    rank: int
    value: int = 0  # its heartbeat counter as last read; 0: it has not started beating
    changed_at: float = 0.0  # watcher's clock: when ``value`` was first read
    left: bool = False  # it stopped its watchdog on purpose (a clean exit): never blamed
    who: str = ""  # "pid 1234 on host"

    def name(self) -> str:
        return f"process {self.rank}" + (f" ({self.who})" if self.who else "")


@dataclass
class Verdict:
    """What the watchdog must do now. ``kind``:

    - ``ok``: nothing.
    - ``silent``: ``peers`` have not answered for ``seconds`` (the collective timeout): end the run.
    - ``store``: the rendezvous store has not answered for ``seconds``: end this process.
    - ``stand_down``: the store is gone after a peer left cleanly: the run is over, stop watching.
    - ``waiting``: a signal arrived and ``peers`` are silent: the graceful stop cannot happen, end now.
    - ``again``: a second signal (``signum``), and the main thread did not end the process within
      :data:`SECOND_SIGNAL_GRACE` (:data:`ENDING_GRACE` once it said it was ending): end now.
    """

    kind: str
    peers: list[Peer] = field(default_factory=list)
    seconds: float = 0.0
    signum: int | None = None


class Judge:
    """The liveness state of one process's view, and the rules that turn it into a :class:`Verdict`."""

    def __init__(self, rank: int, world_size: int, timeout: float, now: float) -> None:
        self.rank = rank
        self.timeout = timeout
        self.peers = {r: Peer(r, changed_at=now) for r in range(world_size) if r != rank}
        self.read_at = now  # the last complete read of the store
        self.signals: list[tuple[int, float]] = []  # (signum, when), duplicates dropped

    # -- what the service tells it -------------------------------------------------------------
    def observe(self, counters: Mapping[int, int], left: Iterable[int], now: float) -> None:
        """One complete read of the peers' counters (and of who has left), made at ``now``."""
        self.read_at = now
        for rank in left:
            self.peers[rank].left = True
        for rank, value in counters.items():
            peer = self.peers[rank]
            if value != peer.value:
                peer.value, peer.changed_at = value, now

    def signal(self, signum: int, now: float) -> bool:
        """A signal arrived; False when it is a duplicate delivery of the previous one."""
        if self.signals and now - self.signals[-1][1] < DUPLICATE_SIGNAL_WINDOW:
            return False
        self.signals.append((signum, now))
        return True

    # -- what it concludes ---------------------------------------------------------------------
    def silent(self, threshold: float) -> list[Peer]:
        """Peers that beat before and whose counter has not moved for ``threshold`` s, as of the last read.

        Measured between reads of the store, so a slow store never makes a peer look silent; a peer
        that has not started beating yet is not judged (it may still be loading data before its
        Accelerator exists): torch's own collective timeout bounds that case.
        """
        return [p for p in self.peers.values()
                if p.value > 0 and not p.left and self.read_at - p.changed_at >= threshold]

    def verdict(self, now: float, main_ending: bool = False) -> Verdict:
        """What to do at ``now``. ``main_ending``: the main thread is already ending the process
        (it printed why), so it gets longer after a second signal."""
        if len(self.signals) >= 2:
            signum, when = self.signals[1]
            if now - when >= (ENDING_GRACE if main_ending else SECOND_SIGNAL_GRACE):
                return Verdict("again", signum=signum)
        if self.signals:
            waiting = self.silent(min(SIGNAL_GRACE, self.timeout))
            if waiting:
                return Verdict("waiting", waiting, self.read_at - min(p.changed_at for p in waiting),
                               signum=self.signals[0][0])
        silent = self.silent(self.timeout)
        if silent:
            return Verdict("silent", silent, self.read_at - min(p.changed_at for p in silent))
        if now - self.read_at >= self.timeout:
            if any(p.left for p in self.peers.values()):
                return Verdict("stand_down")
            return Verdict("store", seconds=now - self.read_at)
        return Verdict("ok")
