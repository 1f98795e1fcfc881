"""How a run ends (gan_accel.ending): the exit line says what is true, a stop signal is honoured once,
and with two real gloo processes a stopped or dead process is named within ``collective_timeout`` and
Ctrl-C stops both at the same step with a checkpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gan_accel.ending import DUPLICATE_SIGNAL_WINDOW, StopFlag, describe_collective_failure, run_script, stop_on_signals
from gan_accel.processes import EXIT_SILENT_PEER

ROOT = Path(__file__).resolve().parents[1]


# -- what run_script says, in this process ----------------------------------------------------------
def _train(tmp_path, interrupt_at: int | None = None) -> int:
    from conftest import TableLatents, make_images, make_loader, make_models
    from gan_accel import Callback, GANTrainer, TrainConfig

    class Interrupt(Callback):  # a second Ctrl-C: the stop handler raises KeyboardInterrupt in the loop
        def on_step_end(self, trainer):
            if trainer.step == interrupt_at:
                raise KeyboardInterrupt("SIGINT")

    G, D = make_models()
    config = TrainConfig(max_steps=7, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4,
                         checkpoint_every=3, output_dir=str(tmp_path / "run"), progress_bar=False)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), config, latent_sampler=TableLatents(4096),
                         callbacks=[Interrupt()])
    trainer.fit()
    raise KeyboardInterrupt("SIGTERM")  # after training (e.g. during the evaluation an example runs then)


def test_an_interruption_names_the_step_and_checkpoint_it_knows_and_claims_nothing_it_does_not(tmp_path, capsys):
    assert run_script(lambda: _train(tmp_path / "a", interrupt_at=5)) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: interrupted (Ctrl-C) at step 5; The last complete checkpoint is "
        f"{tmp_path / 'a' / 'run' / 'checkpoints' / 'checkpoint_00000003'}; resume with --resume latest "
        "(fit(resume_from='latest')) and the same output folder.")
    # Outside fit() nothing is known of the run: the line says so instead of "nothing was written".
    assert run_script(lambda: _train(tmp_path / "b")) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: interrupted (SIGTERM) outside training; the complete checkpoints written so far, if any, "
        "are untouched.")


def test_the_same_signal_delivered_twice_is_one_request_and_a_later_one_insists():
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


def test_a_collective_broken_by_another_process_is_one_line_and_a_bug_is_not():
    gone = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                        "[127.0.0.1]:51625: Connection reset by peer. This is typically caused by ...")
    assert describe_collective_failure(gone) == (
        "another process ended or lost its connection; stopping outside training; the complete checkpoints "
        "written so far, if any, are untouched.", True)
    timed_out = RuntimeError("[../unbound_buffer.cc:78] Timed out waiting 120000ms for recv operation to complete")
    assert describe_collective_failure(timed_out)[0].startswith("another process has not answered for 120 s (stopped")
    assert describe_collective_failure(RuntimeError("shape mismatch")) is None


# -- two real gloo processes, started by the test (so it sees their exit codes) ----------------------
class Launch:
    """Two processes of one gloo group (rank 0 serves the store), in one process group of their own:
    what a terminal's Ctrl-C reaches. Always cleaned up: SIGCONT, then SIGKILL."""

    def __init__(self, out: Path, flags: list[str]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        for rank in (0, 1):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "TORCHELASTIC_"))}
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
            with open(out / f"log.rank{rank}", "w") as log:
                self.procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "ending_driver.py"),
                                                    str(out), *flags], env=env, cwd=ROOT, stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   process_group=self.procs[0].pid if rank else 0))

    def step(self, rank: int) -> int:
        try:
            return int((self.out / f"step.rank{rank}").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def wait_for_step(self, step: int, limit: float = 120.0) -> None:
        deadline = time.monotonic() + limit
        while min(self.step(0), self.step(1)) < step:
            if any(p.poll() is not None for p in self.procs) or time.monotonic() > deadline:
                pytest.fail(f"no step {step}:\n{self.output(0)}\n{self.output(1)}")
            time.sleep(0.1)

    def output(self, rank: int) -> str:
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


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """The module's three launches, started at once (each process mostly waits: on imports, then on its pace)."""
    out = tmp_path_factory.mktemp("launches")
    started = {"SIGSTOP": Launch(out / "stop", ["--timeout", "5"]), "SIGKILL": Launch(out / "kill", ["--timeout", "5"]),
               "Ctrl-C": Launch(out / "ctrl-c", ["--checkpoint-every", "5"])}
    yield started
    for one in started.values():
        one.close()


@pytest.mark.slow
@pytest.mark.parametrize("how, why", [(signal.SIGSTOP, "has not answered for 5 s (stopped, hung or dead"),
                                      (signal.SIGKILL, "ended or lost its connection")])
def test_a_stopped_or_dead_process_is_named_within_the_timeout(launches, how, why):
    run = launches[how.name]
    run.wait_for_step(7)  # past the checkpoint at step 5
    # The run's collective_timeout is torch's own: the timeout that ends a wait for a stopped process.
    assert [(run.out / f"pg_timeout.rank{r}").read_text() for r in (0, 1)] == ["0:00:05", "0:00:05"]
    os.kill(run.procs[1].pid, how)
    stopped = time.monotonic()
    code = run.procs[0].wait(5 + 25)
    out = run.output(0)
    assert code == EXIT_SILENT_PEER and time.monotonic() - stopped < 5 + 25, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("gan_accel: error: ")]
    assert len(lines) == 1 and lines[0].startswith(f"gan_accel: error: process 1 {why}"), out[-3000:]
    assert "; stopping at step " in lines[0] and "The last complete checkpoint is " in lines[0]
    named = lines[0].split("The last complete checkpoint is ", 1)[1].split(";", 1)[0]
    assert Path(named).parent == run.out / "run" / "checkpoints" and (Path(named) / "COMPLETE").is_file(), lines[0]
    assert "--resume latest" in lines[0]
    assert "Traceback" not in out


@pytest.mark.slow
def test_ctrl_c_on_one_process_stops_both_at_the_same_step_with_a_checkpoint_and_exit_130(launches):
    """Process 1 alone gets Ctrl-C, delivered twice within milliseconds (as a launcher forwards it); as
    torchrun does, the test SIGTERMs the other process the moment the first exits. Both stop by SIGINT at
    the same step (the agreement carries the signal), checkpoint there, exit 130, and one line is printed."""
    run = launches["Ctrl-C"]
    run.wait_for_step(7)
    os.kill(run.procs[1].pid, signal.SIGINT)
    time.sleep(0.01)
    os.kill(run.procs[1].pid, signal.SIGINT)
    codes: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while len(codes) < 2 and time.monotonic() < deadline:
        for rank, proc in enumerate(run.procs):
            if rank not in codes and proc.poll() is not None:
                codes[rank] = proc.returncode
                if run.procs[1 - rank].poll() is None:
                    run.procs[1 - rank].send_signal(signal.SIGTERM)  # what torchrun does when a worker exits non-zero
        time.sleep(0.005)
    outputs = run.output(0) + run.output(1)
    assert codes == {0: 130, 1: 130}, outputs[-4000:]
    stops = [line for line in outputs.splitlines() if line.startswith("gan_accel: stopped by SIGINT at step ")]
    assert len(stops) == 1 and stops[0] in run.output(0), outputs[-4000:]
    name = f"checkpoint_{int(stops[0].split('at step ')[1].split(';')[0]):08d}"
    assert f"The last complete checkpoint is {run.out / 'run' / 'checkpoints' / name}" in stops[0]
    files = {p.name for p in (run.out / "run" / "checkpoints" / name).iterdir()}
    assert {"COMPLETE", "random_states_0.pkl", "random_states_1.pkl"} <= files, "both processes stopped there"
    for bad in ("terminate called", "Traceback", "interrupted"):
        assert bad not in outputs, outputs[-4000:]
