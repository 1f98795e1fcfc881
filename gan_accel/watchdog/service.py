"""The watchdog of one process of a multi-process launch: two daemon threads and the store keys they use.

- ``gan_accel-heartbeat`` bumps this process's counter in the rendezvous store every ``interval``
  seconds and reads the others' counters (two round trips: one ``add``, one ``multi_get``).
- ``gan_accel-watchdog`` never touches the store (a store that stopped answering cannot block it).
  It wakes several times a second, reads the signal numbers that Python's C-level signal handler
  writes to a pipe (``signal.set_wakeup_fd``) at the moment a signal arrives, even while the main
  thread is blocked inside a collective (where Python-level handlers cannot run), and acts on the
  :class:`~gan_accel.watchdog.liveness.Judge`'s verdict: print one line, post the reason in the
  store so every other process ends too, and ``os._exit`` (the main thread may be stuck in C++).

Verified on torch 2.14 / accelerate 1.16 (gloo, CPU): gloo collectives release the GIL while they
wait, so both threads keep running while the main thread sits in an all-reduce whose peer is
stopped; under ``accelerate launch`` / ``torchrun`` the store is a TCPStore served by the launcher
(``TORCHELASTIC_USE_AGENT_STORE=True``), so a stopped rank 0 does not take it down. A TCPStore
client serializes its operations and a blocking ``get``/``wait`` holds the client while it waits,
so the watchdog talks to the store through a client connection of its own and only reads keys that
exist (created with ``add(key, 0)``): it never waits behind the main thread, nor the main thread
behind it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Iterable

from . import run_record
from .liveness import Judge, Peer, SteadyClock, Verdict

#: Exit code of a process ended because another one stopped answering: EX_TEMPFAIL of sysexits.h,
#: "a temporary failure; retry" (resume with ``--resume latest``), unlike 2 (a usage error to fix).
EXIT_SILENT_PEER = 75

#: The signals a user (or a launcher, or a scheduler) sends to stop a run.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

KEY_PREFIX = "gan_accel/watchdog"


def backstop_seconds(timeout: float) -> float:
    """torch's own collective timeout while the watchdog runs: ``max(600, 5 * timeout)`` seconds.

    It ends a collective that waits for a process that is alive but never arrives (a deadlock, a
    hung GPU kernel): heartbeats cannot see that. It must stay above the longest legitimate wait
    (the main process alone evaluating or writing a checkpoint while the others wait), so it is at
    least 10 minutes, torch's default for NCCL (what GPU runs had already; gloo's default is 30), and
    always well above the liveness timeout, so that a stopped or dead process is reported by the
    watchdog, by name, first. Raise ``collective_timeout`` to raise both.
    """
    return max(600.0, 5.0 * timeout)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StoreView:
    """The watchdog's keys, under ``gan_accel/watchdog/<restart>/``:

    ``beat/<r>`` (counter), ``left/<r>`` (1 once process r stopped watching on purpose),
    ``who/<r>`` ("pid 1234 on host"), ``abort`` ("-", or "<exit code> <rank>" once a process ended the
    run), ``acks`` (how many processes read it).
    """

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        import torch.distributed as dist

        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # an elastic restart starts afresh
        self.store = dist.PrefixStore(f"{KEY_PREFIX}/{restart}", store)
        self.rank, self.peers = rank, [r for r in range(world_size) if r != rank]

    def setup(self) -> None:
        for r in range(len(self.peers) + 1):  # every key multi_get reads exists from now on
            self.store.add(f"beat/{r}", 0)
            self.store.add(f"left/{r}", 0)
        self.store.compare_set("abort", "", "-")
        self.store.add("acks", 0)
        self.store.set(f"who/{self.rank}", f"pid {os.getpid()} on {socket.gethostname()}")

    def beat(self) -> None:
        self.store.add(f"beat/{self.rank}", 1)

    def read(self) -> tuple[dict[int, int], list[int], str]:
        """(counters of the peers, the peers that left, the abort value), in one round trip."""
        keys = [f"beat/{r}" for r in self.peers] + [f"left/{r}" for r in self.peers] + ["abort"]
        values = self.store.multi_get(keys)
        n = len(self.peers)
        counters = {r: int(v) for r, v in zip(self.peers, values[:n])}
        left = [r for r, v in zip(self.peers, values[n:2 * n]) if int(v) > 0]
        return counters, left, values[-1].decode()

    def who(self, rank: int) -> str:
        key = f"who/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else ""

    def post_abort(self, code: int) -> bool:
        """Tell every process to end; True when this one was the first to."""
        mine = f"{code} {self.rank}"
        return self.store.compare_set("abort", "-", mine).decode() == mine

    def acknowledge(self) -> None:
        """A follower read the abort (its poster may serve the store: it waits for this before exiting)."""
        self.store.add("acks", 1)

    def acknowledged(self) -> int:
        return self.store.add("acks", 0)

    def goodbye(self) -> None:
        self.store.add(f"left/{self.rank}", 1)


def store_op_timeout(timeout: float) -> float:
    """How long one store operation of the watchdog may take (a failed one is retried at the next beat).

    Short, so that the heartbeat thread is never inside the store for long: a daemon thread still
    inside a torch call (which released the GIL) when the interpreter finalizes is ended by CPython with
    ``pthread_exit``, whose forced unwinding through pybind11's ``noexcept`` GIL guard aborts the process
    ("terminate called without an active exception", exit -6; verified on torch 2.14 / Python 3.11).
    :meth:`Watchdog.stop` (at ``atexit`` at the latest) waits this long, plus one second, for it.
    """
    return min(5.0, max(1.0, timeout / 4))


def watchdog_store(default_store: Any, timeout: float) -> Any:
    """A store for the watchdog: its own TCPStore client when the default store is a TCPStore, else the default store.

    A FileStore (``accelerate.debug_launcher``, the tests' launcher) takes a file lock per operation
    and never holds it while waiting, so sharing it is safe.
    """
    import torch.distributed as dist

    inner = default_store
    while isinstance(inner, dist.PrefixStore):
        inner = inner.underlying_store
    if isinstance(inner, dist.TCPStore):
        return dist.TCPStore(inner.host, inner.port, is_master=False,
                             timeout=timedelta(seconds=store_op_timeout(timeout)))
    return default_store


def _flush_and_exit(code: int, line: str | None) -> None:
    """Print ``line`` and end this process at once (the main thread may be stuck in C++)."""
    flusher = threading.Thread(target=lambda: (sys.stdout.flush(), sys.stderr.flush()), daemon=True)
    flusher.start()
    flusher.join(1.0)  # the main thread could hold a stream's lock forever
    if line:
        os.write(2, (line + "\n").encode())
    os._exit(code)


class Watchdog:
    """Heartbeats and signal handling for one process; see the module's docstring.

    ``exit`` ends the process (tests pass a recorder); ``signals``: watch SIGINT/SIGTERM through
    ``signal.set_wakeup_fd`` (main thread only, one per process).
    """

    def __init__(self, store: Any, rank: int, world_size: int, timeout: float, *, signals: bool = True,
                 exit: Callable[[int, str | None], None] = _flush_and_exit,
                 real_clock: Callable[[], float] | None = None) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.interval = min(1.0, max(0.2, timeout / 5))  # at least 5 beats per timeout
        self.tick = min(0.25, self.interval / 2)
        clock_args = {} if real_clock is None else {"real": real_clock}
        self.clock = SteadyClock(max_step=max(2.0, 4 * self.interval), **clock_args)
        self.view = StoreView(store, rank, world_size)
        self.judge = Judge(rank, world_size, timeout, self.clock.now())
        self._exit = exit
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._paused = threading.Event()  # tests: stop beating, as a stopped process would
        self._abort = "-"
        self._goodbye = True
        self._threads: list[threading.Thread] = []
        self._signals = signals
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup_fd = -1
        self.ended: tuple[int, str | None] | None = None

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> "Watchdog":
        self.view.setup()
        if self._signals and threading.current_thread() is threading.main_thread():
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)  # the C handler must never block
            os.set_blocking(read_fd, False)
            self._previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            self._pipe = (read_fd, write_fd)
        for name, target in (("gan_accel-heartbeat", self._beat_loop), ("gan_accel-watchdog", self._watch_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, goodbye: bool = True) -> None:
        """Stop watching; ``goodbye``: tell the others this process leaves on purpose (never blame it)."""
        self._goodbye = goodbye
        self._stopping.set()
        for thread in self._threads:
            if thread is not threading.current_thread():  # out of the store before the interpreter finalizes
                thread.join(store_op_timeout(self.timeout) + 1.0)
        if self._pipe is not None:
            if threading.current_thread() is threading.main_thread():
                try:
                    signal.set_wakeup_fd(self._previous_wakeup_fd)
                except ValueError:  # pragma: no cover - the interpreter is shutting down
                    pass
                for fd in self._pipe:
                    os.close(fd)
            self._pipe = None

    def pause(self) -> None:
        """Tests: stop beating (reading goes on), which is how a stopped process looks to the others."""
        self._paused.set()

    # -- the heartbeat thread ------------------------------------------------------------------
    def _beat_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self._paused.is_set():
                    self.view.beat()
                counters, left, abort = self.view.read()
                now = self.clock.now()
                with self._lock:
                    self.judge.observe(counters, left, now)
                    self._abort = abort
                    unnamed = [p for p in self.judge.peers.values() if p.value > 0 and not p.who]
                for peer in unnamed:
                    peer.who = self.view.who(peer.rank)
            except Exception:  # the store did not answer: the watch thread judges how long for
                pass
            self._stopping.wait(self.interval)
        if self._goodbye:
            try:
                self.view.goodbye()
            except Exception:
                pass

    # -- the watch thread ----------------------------------------------------------------------
    def _watch_loop(self) -> None:
        while not self._stopping.is_set():
            signums = self._wait_for_signals(self.tick)
            now = self.clock.now()
            with self._lock:
                for signum in signums:
                    self.judge.signal(signum, now)
                verdict = self.judge.verdict(now, main_ending=run_record.ending_claimed())
                abort = self._abort
            if self._stopping.is_set():
                return
            if abort != "-" and not abort.endswith(f" {self.rank}"):
                try:
                    self.view.acknowledge()
                except Exception:
                    pass
                self._end(int(abort.split()[0]), None)  # another process ended the run and said why
                return
            if verdict.kind == "stand_down":
                return
            if verdict.kind != "ok":
                self._act(verdict)
                return

    def _wait_for_signals(self, seconds: float) -> list[int]:
        if self._pipe is None:
            self._stopping.wait(seconds)
            return []
        try:
            ready, _, _ = select.select([self._pipe[0]], [], [], seconds)
            data = os.read(self._pipe[0], 512) if ready else b""
        except (OSError, ValueError):  # closed by stop()
            return []
        if data and self._previous_wakeup_fd >= 0:
            try:
                os.write(self._previous_wakeup_fd, data)  # whoever had the wakeup fd before still hears
            except OSError:
                pass
        return [b for b in data if b in STOP_SIGNALS]

    def _act(self, verdict: Verdict) -> None:
        note = run_record.checkpoint_note()
        if verdict.kind == "store":
            line = (f"gan_accel: error: the rendezvous store (served by the launcher, or by process 0) has not "
                    f"answered for {verdict.seconds:.0f} s: its process or host is gone or unreachable; stopping "
                    f"this process. {note}")
            self._end(EXIT_SILENT_PEER, line)
            return
        if verdict.kind == "silent":
            code = EXIT_SILENT_PEER
            line = (f"gan_accel: error: {_names(verdict.peers)} not answered for {verdict.seconds:.0f} s (stopped, "
                    f"hung or dead); stopping every process. {note}")
        elif verdict.kind == "waiting":
            code = 128 + (verdict.signum or signal.SIGINT)
            line = (f"gan_accel: interrupted ({signal_name(code - 128)}) {run_record.where()} while waiting for "
                    f"{_names(verdict.peers, which=True)} not answered for {verdict.seconds:.0f} s; stopping every "
                    f"process now. {note}")
        else:  # "again"
            code = 128 + (verdict.signum or signal.SIGINT)
            line = (f"gan_accel: interrupted again ({signal_name(code - 128)}) {run_record.where()}: stopping at "
                    f"once. {note}")
        first = self.announce(code, skip=[p.rank for p in verdict.peers])
        # One line per launch: the first process to post the reason prints it; for a signal, only if
        # the main thread has not already printed why it ends.
        quiet = not first or (verdict.kind != "silent" and not run_record.claim_ending())
        self._end(code, None if quiet else line)

    def announce(self, code: int, skip: Iterable[int] = ()) -> bool:
        """Post that this process ends the run with ``code``; True when it is the first to.

        The first then waits, a couple of heartbeats at most, until every other process (but those in
        ``skip``: the silent ones) has read it or has left: this process may be the one serving the
        store (rank 0 without a launcher's store), and once it is gone the others could not read why
        they must end.
        """
        try:
            first = self.view.post_abort(code)
        except Exception:
            return True
        if first:
            expected = [r for r in self.judge.peers if r not in set(skip)]
            deadline = self.clock.now() + 2 * self.interval + 1.0
            try:
                while self.clock.now() < deadline:
                    _, left, _ = self.view.read()
                    if self.view.acknowledged() + len([r for r in left if r in expected]) >= len(expected):
                        break
                    self._stopping.wait(0.05)
            except Exception:
                pass
        return first

    def _end(self, code: int, line: str | None) -> None:
        self.ended = (code, line)
        self._stopping.set()
        self._goodbye = False  # ending because of a failure: the others must not take it as a clean exit
        self._exit(code, line)


def _names(peers: list[Peer], which: bool = False) -> str:
    """``"process 1 (pid 12 on h) has"`` / ``"processes 1 (...), 3 (...) have"`` (``which``: "..., which has")."""
    names = ", ".join(p.name() if i == 0 else p.name().replace("process ", "") for i, p in enumerate(peers))
    if len(peers) > 1:
        names = names.replace("process ", "processes ", 1)
    verb = "has" if len(peers) == 1 else "have"
    return f"{names}, which {verb}" if which else f"{names} {verb}"
