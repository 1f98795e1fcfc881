"""The liveness watchdog: bounded collective waits, and signals honoured inside a wait.

Fast tests drive the pure logic with a fake clock, and two watchdogs (ranks 0 and 1) in this process
over one in-memory store. The slow ones launch two real gloo processes and stop one with SIGSTOP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gan_accel.watchdog import run_record
from gan_accel.watchdog.liveness import (DUPLICATE_SIGNAL_WINDOW, ENDING_GRACE, SECOND_SIGNAL_GRACE, SIGNAL_GRACE,
                                         Judge, SteadyClock)
from gan_accel.watchdog.service import EXIT_SILENT_PEER, Watchdog, backstop_seconds


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_run_record():
    run_record.reset()
    yield
    run_record.reset()


# -- the pure logic, on a fake clock ---------------------------------------------------------------
class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_steady_clock_does_not_count_the_time_its_own_process_was_frozen():
    real = FakeTime()
    clock = SteadyClock(max_step=2.0, real=real)
    start = clock.now()
    real.t += 0.5
    assert clock.now() - start == pytest.approx(0.5)
    real.t += 300  # stopped and continued: only max_step of it counts
    assert clock.now() - start == pytest.approx(2.5)
    real.t -= 10  # a monotonic clock never does this; nothing is subtracted if it did
    assert clock.now() - start == pytest.approx(2.5)


def beats(judge: Judge, now: float, **counters: int) -> None:
    judge.observe({int(k[1:]): v for k, v in counters.items()}, left=(), now=now)


def test_a_peer_whose_counter_stops_is_silent_after_the_timeout_and_not_before():
    judge = Judge(rank=0, world_size=3, timeout=10.0, now=0.0)
    for t in range(0, 30):
        beats(judge, float(t), r1=t + 1, r2=min(t + 1, 5))  # process 2 stops beating at t=4
        verdict = judge.verdict(float(t))
        if t < 14:
            assert verdict.kind == "ok", t
        else:
            assert verdict.kind == "silent" and [p.rank for p in verdict.peers] == [2], t
            assert verdict.seconds >= 10
            break
    else:
        pytest.fail("never reported")


def test_a_peer_that_never_started_beating_or_left_cleanly_is_never_blamed():
    judge = Judge(rank=1, world_size=3, timeout=5.0, now=0.0)
    judge.observe({0: 3, 2: 0}, left=[0], now=0.0)  # 0 said goodbye, 2 is still loading data
    for t in range(1, 60):
        judge.observe({0: 3, 2: 0}, left=[], now=float(t))
        assert judge.verdict(float(t)).kind == "ok"


def test_a_slow_store_makes_nobody_silent_and_a_dead_store_is_named():
    judge = Judge(rank=0, world_size=2, timeout=10.0, now=0.0)
    beats(judge, 1.0, r1=7)
    # No read completes after t=1: the peer's counter is as fresh as the last read, so only the store
    # is to blame, and only after the timeout.
    assert judge.verdict(9.0).kind == "ok"
    verdict = judge.verdict(11.5)
    assert verdict.kind == "store" and verdict.seconds == pytest.approx(10.5)
    judge.observe({1: 7}, left=[1], now=12.0)  # the peer left on purpose, then the store went away
    assert judge.verdict(30.0).kind == "stand_down"


def test_a_signal_ends_the_wait_for_a_silent_peer_within_the_grace_and_a_healthy_run_stops_gracefully():
    judge = Judge(rank=0, world_size=2, timeout=120.0, now=0.0)
    beats(judge, 0.0, r1=1)
    assert judge.signal(signal.SIGINT, 1.0)
    for t in range(1, 10):
        beats(judge, float(t), r1=t + 1)  # alive: the graceful stop (one more step, a checkpoint) goes on
        assert judge.verdict(float(t)).kind == "ok"
    for t in range(10, 10 + int(SIGNAL_GRACE) + 2):
        beats(judge, float(t), r1=10)  # stopped at t=9
    verdict = judge.verdict(10.0 + SIGNAL_GRACE + 1)
    assert verdict.kind == "waiting" and verdict.signum == signal.SIGINT and verdict.peers[0].rank == 1


def test_a_second_signal_ends_within_seconds_but_a_duplicate_delivery_is_the_same_request():
    judge = Judge(rank=0, world_size=2, timeout=120.0, now=0.0)
    assert judge.signal(signal.SIGINT, 5.0)
    assert not judge.signal(signal.SIGINT, 5.0 + DUPLICATE_SIGNAL_WINDOW / 50)  # the launcher forwarding it
    assert not judge.signal(signal.SIGTERM, 5.0 + DUPLICATE_SIGNAL_WINDOW / 2)
    assert judge.verdict(20.0).kind == "ok"
    assert judge.signal(signal.SIGTERM, 21.0)  # the user insists
    assert judge.verdict(21.0 + SECOND_SIGNAL_GRACE / 2).kind == "ok"  # the main thread may end it itself
    verdict = judge.verdict(21.0 + SECOND_SIGNAL_GRACE)
    assert verdict.kind == "again" and verdict.signum == signal.SIGTERM
    # When the main thread said it is ending the process, it gets longer before the watchdog steps in.
    assert judge.verdict(21.0 + SECOND_SIGNAL_GRACE, main_ending=True).kind == "ok"
    assert judge.verdict(21.0 + ENDING_GRACE, main_ending=True).kind == "again"


def test_backstop_is_bounded_and_above_the_liveness_timeout():
    assert backstop_seconds(120) == 600
    assert backstop_seconds(5) == 600
    assert backstop_seconds(600) == 3000


# -- two watchdogs over one in-memory store ---------------------------------------------------------
class Recorder:
    """Stands in for os._exit: records (code, line) and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str | None, float]] = []
        self.event = threading.Event()

    def __call__(self, code: int, line: str | None) -> None:
        self.calls.append((code, line, time.monotonic()))
        self.event.set()


def pair(timeout: float):
    import torch.distributed as dist

    store = dist.HashStore()
    recorders = [Recorder(), Recorder()]
    dogs = [Watchdog(store, rank, 2, timeout, signals=False, exit=recorders[rank]) for rank in (0, 1)]
    for dog in dogs:
        dog.start()
    return dogs, recorders


def test_watchdogs_over_a_store_name_the_silent_process_and_every_process_ends():
    dogs, (end0, end1) = pair(timeout=1.0)
    try:
        time.sleep(1.0)  # both beat
        started = time.monotonic()
        dogs[1].pause()  # process 1 stops beating, as SIGSTOP would do
        assert end0.event.wait(10), "process 0 never noticed"
        code, line, when = end0.calls[0]
        # Silence counts from process 1's last beat, which came up to one beat before the pause.
        assert code == EXIT_SILENT_PEER and 1.0 - dogs[1].interval <= when - started < 6
        assert line.startswith("gan_accel: error: process 1 (pid ") and "not answered for" in line
        assert "stopping every process" in line and "This launch wrote no checkpoint" in line
        assert end1.event.wait(5), "process 1 must follow the abort process 0 posted"
        assert end1.calls[0][:2] == (EXIT_SILENT_PEER, None)  # one line per launch
    finally:
        for dog in dogs:
            dog.stop(goodbye=False)


def test_watchdogs_stay_quiet_while_everyone_beats_and_after_a_clean_goodbye():
    dogs, (end0, end1) = pair(timeout=1.0)
    try:
        time.sleep(3.0)  # three timeouts, with a main thread doing nothing at all: beats are from threads
        dogs[1].stop(goodbye=True)  # leaves the group on purpose
        time.sleep(2.5)
        assert end0.calls == [] and end1.calls == []
    finally:
        for dog in dogs:
            dog.stop(goodbye=False)


EXIT_WHILE_IN_THE_STORE = """
import atexit, datetime, sys, time
import torch.distributed as dist
from gan_accel.watchdog.service import Watchdog, watchdog_store
server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))
dog = Watchdog(watchdog_store(dist.PrefixStore("default_pg", server), 4.0), 0, 2, 4.0, signals=False)
dog.view.read = lambda: dog.view.store.multi_get(["never-set"])  # a store that does not answer: 1 s per try
dog.start()
if sys.argv[1] == "stop-at-exit":
    atexit.register(dog.stop)  # what start_watchdog registers
time.sleep(0.5)  # the heartbeat thread is now inside the store, with the GIL released
sys.exit(3)
"""


def test_the_heartbeat_thread_is_out_of_the_store_before_the_interpreter_finalizes():
    """A daemon thread still inside a torch call when the interpreter finalizes aborts the process
    ("terminate called without an active exception"); stop() waits for the store call to give up."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", EXIT_WHILE_IN_THE_STORE, "stop-at-exit"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 3 and "terminate called" not in result.stderr, result.stderr[-2000:]


# -- what a run says when it is interrupted ---------------------------------------------------------
class FakeTrainer:
    def __init__(self, step, fit_calls, last_checkpoint=None):
        self.step, self.fit_calls, self.last_checkpoint = step, fit_calls, last_checkpoint

    def checkpoint_note(self):
        return f"The last complete checkpoint is {self.last_checkpoint}" if self.last_checkpoint else "No checkpoint"


def test_a_collective_broken_by_a_process_that_went_away_is_one_line_and_a_bug_is_not():
    from gan_accel.watchdog import describe_collective_failure

    gone = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                        "[127.0.0.1]:51625: Connection reset by peer. This is typically caused by ...")
    line = describe_collective_failure(gone)
    assert line.startswith("another process ended or lost its connection (Read error [127.0.0.1]:51625: Connection "
                           "reset by peer.")
    assert line.endswith("before training started; This launch wrote no checkpoint (the checkpoints of earlier "
                         "launches, if any, are untouched).")
    timed_out = RuntimeError("[../unbound_buffer.cc:78] Timed out waiting 600000ms for recv operation to complete")
    assert describe_collective_failure(timed_out).startswith("a wait for another process ran past torch's timeout")
    assert describe_collective_failure(RuntimeError("shape mismatch")) is None


def test_the_interrupted_line_says_what_was_written():
    assert run_record.interrupted_line("interrupted") == (
        "interrupted before training started; This launch wrote no checkpoint (the checkpoints of earlier "
        "launches, if any, are untouched).")
    trainer = FakeTrainer(180, 1, "runs/x/checkpoints/checkpoint_00000180")
    run_record.track_run(trainer)
    line = run_record.interrupted_line("interrupted")
    assert line.startswith("interrupted at step 180; The last complete checkpoint is runs/x/checkpoints/checkpoint_00000180")
    assert run_record.claim_ending() and not run_record.claim_ending()


# -- two real gloo processes, started by the test (so it sees their exit codes) ----------------------
import socket  # noqa: E402

DRIVER = str(ROOT / "tests" / "watchdog_driver.py")


class Launch:
    """Two processes of one gloo group (rank 0 serves the store), in one process group of their own:
    what a terminal's Ctrl-C reaches. Always cleaned up: SIGCONT, then SIGKILL."""

    def __init__(self, out: Path, mode: str, flags: list[str]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        for rank in (0, 1):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "TORCHELASTIC_"))}
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
            log = open(out / f"log.rank{rank}", "w")
            self.logs.append(log)
            self.procs.append(subprocess.Popen([sys.executable, DRIVER, mode, str(out), *flags], env=env, cwd=ROOT,
                                               stdout=log, stderr=subprocess.STDOUT,
                                               process_group=self.procs[0].pid if rank else 0))
        self.pgid = self.procs[0].pid

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def step(self, rank: int) -> int:
        try:
            return int((self.out / f"step.rank{rank}").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def wait_for_step(self, step: int, limit: float = 90.0) -> None:
        deadline = time.monotonic() + limit
        while min(self.step(0), self.step(1)) < step:
            if any(p.poll() is not None for p in self.procs):
                pytest.fail(f"a process ended early:\n{self.output(0)}\n{self.output(1)}")
            if time.monotonic() > deadline:
                pytest.fail(f"no step {step} within {limit} s:\n{self.output(0)}\n{self.output(1)}")
            time.sleep(0.1)

    def wait(self, rank: int, limit: float) -> int | None:
        """The exit code of ``rank`` once it ends, or None if it runs past ``limit`` seconds."""
        try:
            return self.procs[rank].wait(limit)
        except subprocess.TimeoutExpired:
            return None

    def output(self, rank: int) -> str:
        self.logs[rank].flush()
        return (self.out / f"log.rank{rank}").read_text()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(proc.pid, sig)
                    except ProcessLookupError:
                        pass
                proc.wait(30)
        for log in self.logs:
            log.close()


@pytest.fixture
def launch(tmp_path):
    launches: list[Launch] = []

    def start(mode: str, *flags: str) -> Launch:
        launches.append(Launch(tmp_path / f"launch{len(launches)}", mode, list(flags)))
        return launches[-1]

    yield start
    for one in launches:
        one.close()


@pytest.mark.slow
def test_a_stopped_process_is_named_and_the_other_ends_within_the_timeout(launch):
    run = launch("tiny", "--timeout", "5")
    run.wait_for_step(8)  # past the checkpoint at step 5
    os.kill(run.pid(1), signal.SIGSTOP)
    stopped = time.monotonic()
    code = run.wait(0, limit=5 + 20)
    elapsed = time.monotonic() - stopped
    out = run.output(0)
    assert code == EXIT_SILENT_PEER, out[-3000:]
    assert 5 - 1 <= elapsed < 5 + 20  # counted from its last heartbeat, up to 1 s before the SIGSTOP
    lines = [line for line in out.splitlines() if "has not answered" in line]
    assert len(lines) == 1, out[-3000:]
    assert lines[0].startswith(f"gan_accel: error: process 1 (pid {run.pid(1)} on ")
    assert "(stopped, hung or dead); stopping every process. The last complete checkpoint is " in lines[0]
    assert "checkpoint_0000000" in lines[0] and "--resume latest" in lines[0]
    assert "Traceback" not in out


@pytest.mark.slow
def test_the_main_process_busy_longer_than_the_timeout_does_not_trip_it(launch):
    """Process 0 alone sleeps 10 s (evaluating, writing a big checkpoint) while process 1 waits in a
    collective: with a 3 s timeout, heartbeats from both keep the run going."""
    run = launch("tiny", "--timeout", "3", "--steps", "10", "--step-sleep", "0", "--sleep-at", "0:4:10")
    codes = [run.wait(0, limit=240), run.wait(1, limit=30)]
    assert codes == [0, 0], run.output(0)[-3000:] + run.output(1)[-3000:]
    assert "not answered" not in run.output(0) + run.output(1)
    # torch's own timeout, the backstop for a process that is alive but never arrives: 10 min, not gloo's 30.
    assert [(run.out / f"pg_timeout.rank{r}").read_text() for r in (0, 1)] == ["0:10:00", "0:10:00"]


@pytest.mark.slow
def test_sigint_while_waiting_for_a_stopped_process_ends_within_seconds(launch):
    """Ctrl-C reaches the main thread only between bytecodes; blocked in a collective whose peer is
    stopped, it never would (the liveness timeout here is a minute). The watchdog hears it at once."""
    run = launch("tiny", "--timeout", "60", "--checkpoint-every", "2")
    run.wait_for_step(5)
    os.kill(run.pid(1), signal.SIGSTOP)
    time.sleep(1.0)  # process 0 is now waiting for it
    os.kill(run.pid(0), signal.SIGINT)
    signalled = time.monotonic()
    code = run.wait(0, limit=SIGNAL_GRACE + 20)
    elapsed = time.monotonic() - signalled
    out = run.output(0)
    assert code == 128 + signal.SIGINT, out[-3000:]
    assert elapsed < SIGNAL_GRACE + 20 < 60
    lines = [line for line in out.splitlines() if line.startswith("gan_accel: interrupted")]
    assert len(lines) == 1, out[-3000:]
    assert f"while waiting for process 1 (pid {run.pid(1)} on " in lines[0]
    assert "stopping every process now. The last complete checkpoint is " in lines[0] and "checkpoint_0000000" in lines[0]


@pytest.mark.slow
def test_a_second_sigint_ends_at_once_even_when_the_wait_is_for_a_live_process(launch):
    """Process 1 is alive but busy for two minutes: the first Ctrl-C asks for the graceful stop (which
    waits for it), the second ends the run within seconds, and process 1 follows."""
    run = launch("tiny", "--timeout", "60", "--checkpoint-every", "2", "--step-sleep", "0.2", "--sleep-at", "1:4:120")
    run.wait_for_step(4)
    time.sleep(1.0)  # process 0 waits in step 5 for process 1
    os.kill(run.pid(0), signal.SIGINT)
    assert run.wait(0, limit=3) is None, "a live peer: the first Ctrl-C waits for the graceful stop"
    os.kill(run.pid(0), signal.SIGINT)
    again = time.monotonic()
    code = run.wait(0, limit=SECOND_SIGNAL_GRACE + 15)
    elapsed = time.monotonic() - again
    out = run.output(0)
    assert code == 128 + signal.SIGINT and elapsed < SECOND_SIGNAL_GRACE + 15, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("gan_accel: interrupted")]
    assert lines == [line for line in lines if "interrupted again (SIGINT) at step 4: stopping at once. The last "
                     "complete checkpoint is " in line and "checkpoint_00000002" in line] and len(lines) == 1, out[-3000:]
    assert run.wait(1, limit=15) == 128 + signal.SIGINT, "process 1 follows the end process 0 announced"
    assert "gan_accel: interrupted" not in run.output(1), "one line per launch"


@pytest.mark.slow
def test_ctrl_c_stops_both_processes_at_the_same_step_with_a_checkpoint_and_exit_130(launch):
    """The terminal's Ctrl-C reaches both processes; a launcher delivers it again within milliseconds;
    as torchrun does, the test SIGTERMs the other process the moment the first exits. Before: the second
    delivery was taken for an insisting second Ctrl-C ("interrupted before training started; nothing was
    written" after checkpointed steps), and the launcher's SIGTERM killed the slower rank (exit -15)."""
    run = launch("tiny", "--checkpoint-every", "5")
    run.wait_for_step(7)
    out = run.out / "run"
    os.killpg(run.pgid, signal.SIGINT)
    time.sleep(0.01)
    os.killpg(run.pgid, signal.SIGINT)  # the launcher forwarding the same Ctrl-C
    codes: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while len(codes) < 2 and time.monotonic() < deadline:
        for rank, proc in enumerate(run.procs):
            if rank not in codes and proc.poll() is not None:
                codes[rank] = proc.returncode
                other = run.procs[1 - rank]
                if other.poll() is None:
                    other.send_signal(signal.SIGTERM)  # what torchrun does when a worker exits non-zero
        time.sleep(0.005)
    outputs = run.output(0) + run.output(1)
    assert codes == {0: 130, 1: 130}, outputs[-4000:]
    stops = [line for line in run.output(0).splitlines() if line.startswith("gan_accel: stopped by SIGINT at step ")]
    assert len(stops) == 1, outputs[-4000:]
    step = int(stops[0].split("at step ")[1].split(";")[0])
    name = f"checkpoint_{step:08d}"
    assert f"The last complete checkpoint is {out / 'checkpoints' / name}" in stops[0]
    files = {p.name for p in (out / "checkpoints" / name).iterdir()}
    assert {"COMPLETE", "random_states_0.pkl", "random_states_1.pkl"} <= files, "both processes stopped there"
    for bad in ("terminate called", "nothing was written", "Traceback", "interrupted (Ctrl-C)"):
        assert bad not in outputs, outputs[-4000:]


# -- what run_script says, in this process ----------------------------------------------------------
def _train_then_interrupt(tmp_path, interrupt: BaseException):
    from conftest import TableLatents, make_images, make_loader, make_models
    from gan_accel import GANTrainer, TrainConfig

    G, D = make_models()
    config = TrainConfig(max_steps=7, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4,
                         checkpoint_every=3, output_dir=str(tmp_path / "run"), progress_bar=False)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), config, latent_sampler=TableLatents(4096))
    trainer.fit(stop_at_step=7)
    raise interrupt  # e.g. during the evaluation the example runs after training


def test_a_keyboard_interrupt_after_checkpoints_names_the_last_one(tmp_path, capsys):
    from gan_accel.scripts import run_script

    code = run_script(lambda: _train_then_interrupt(tmp_path, KeyboardInterrupt()))
    err = capsys.readouterr().err
    assert code == 130
    assert err.strip().splitlines()[-1] == (
        f"error: interrupted (Ctrl-C) at step 7; The last complete checkpoint is "
        f"{tmp_path / 'run' / 'checkpoints' / 'checkpoint_00000007'}; resume with --resume latest "
        "(fit(resume_from='latest')) and the same output folder.")
    assert "nothing was written" not in err


def test_a_keyboard_interrupt_before_training_says_no_checkpoint_was_written_and_sigterm_is_named(capsys):
    from gan_accel.scripts import run_script

    def interrupted() -> int:
        raise KeyboardInterrupt("SIGTERM")  # how gan_accel's stop handler names a second SIGTERM

    assert run_script(interrupted) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip() == (
        "error: interrupted (SIGTERM) before training started; This launch wrote no checkpoint (the checkpoints of "
        "earlier launches, if any, are untouched).")


def test_the_same_signal_delivered_twice_is_one_request_and_a_later_one_insists():
    from gan_accel.callbacks.signals import StopFlag, stop_on_signals

    flag = StopFlag()
    with stop_on_signals(flag):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # a launcher forwarding the Ctrl-C the process also got
            time.sleep(0.01)
        except KeyboardInterrupt:
            pytest.fail("one Ctrl-C delivered twice was taken for a second, insisting one")
        assert flag.signum == signal.SIGINT
        time.sleep(DUPLICATE_SIGNAL_WINDOW)
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler runs at the next bytecode
