"""Every interruption ends in one line and leaves nothing that blocks the retry: ``gan-accel`` in a process of its
own, paused at a stage by tests/stage_driver.py, gets a real SIGTERM or SIGINT there (scan, image-cache build,
training, checkpoint write, export, evaluation), or a SIGKILL followed by the same command; one process of a
two-process launch killed in training or during the first checkpoint ends the other in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--batch-size", "8", "--width", "4", "--sample-every", "2", "--log-every", "1", "--checkpoint-every", "2",
        "--no-progress"]


def hidden_temporaries(*folders: Path) -> list[Path]:
    """The temporaries a writer leaves when it is not cleaned up (``.<name>.<host>.<pid>.tmp``, ``.tmp-...``)."""
    return [p for folder in folders if folder.exists() for p in folder.rglob(".*")
            if p.name.endswith((".tmp", ".compact")) or p.name.startswith(".tmp-")]


def command(stage: str, signum: int | None, argv: list, base: Path) -> tuple[int, list[str]]:
    """``gan-accel ARGV`` paused at ``stage`` and sent ``signum`` there (None: let it run): (exit code, the
    non-empty lines of its stderr)."""
    ready = base / f"ready-{stage}-{signum}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GAN_ACCEL_CACHE=str(base / "cache"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "stage_driver.py"), stage, str(ready), "--",
                             *map(str, argv)], env=env, cwd=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 240
    while signum is not None and not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if signum is not None:
        assert ready.exists(), f"stage {stage} never reached:\n{proc.communicate(timeout=60)[1][-3000:]}"
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=240)
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def write_images(folder: Path, count: int = 24) -> None:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize((40, 36)).save(folder / f"{i}.png")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Images, and a finished 4-step run on them (the source of the export and evaluation cases)."""
    base = tmp_path_factory.mktemp("interruptions")
    write_images(base / "photos")
    code, lines = command("none", None, ["train", "--data", base / "photos", "--output-dir", base / "run", "--steps",
                                         4, *TINY], base)
    assert code == 0, lines[-20:]
    return base


def one_line(code: int, lines: list[str], signum: int) -> str:
    assert code == 128 + signum and len(lines) == 1, (code, lines[-20:])
    assert "Traceback" not in lines[0]
    return lines[0]


NAME = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}
# Each stage gets one of the two signals, the cache build both (each subprocess costs seconds of imports): the
# rule makes them one path (run_script turns SIGTERM into KeyboardInterrupt), so alternating covers it.


@pytest.mark.parametrize(("stage", "signum"), [("scan", signal.SIGTERM), ("cache", signal.SIGINT),
                                               ("cache", signal.SIGTERM)])
def test_a_signal_before_training_is_one_line_and_the_same_command_then_runs(base, tmp_path, stage, signum):
    out = tmp_path / "run"
    argv = ["train", "--data", base / "photos", "--output-dir", out, "--steps", 2, "--cache-dir", tmp_path / "c",
            *TINY]
    line = one_line(*command(stage, signum, argv, tmp_path), signum)
    assert line == f"error: interrupted ({NAME[signum]}) outside training; the complete checkpoints written so far, " \
                   "if any, are untouched."
    assert hidden_temporaries(tmp_path / "c") == [] and not out.exists()
    if stage == "cache" and signum == signal.SIGTERM:  # the retry: the same command, to the end
        code, lines = command("none", None, argv, tmp_path)
        assert code == 0, lines[-20:]


@pytest.mark.parametrize(("stage", "signum"), [("train", signal.SIGINT), ("checkpoint", signal.SIGTERM)])
def test_a_signal_in_training_checkpoints_and_says_how_to_go_on(base, tmp_path, stage, signum):
    out = tmp_path / "run"
    argv = ["train", "--data", base / "photos", "--output-dir", out, "--steps", 8, *TINY]
    line = one_line(*command(stage, signum, argv, tmp_path), signum)
    name = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}[signum]
    assert line.startswith(f"gan_accel: stopped by {name} at step ") and "--resume latest" in line, line
    step = int(line.split(" at step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"checkpoint_{step:08d}" / "COMPLETE").is_file()
    assert hidden_temporaries(out) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_a_signal_during_export_leaves_nothing_and_the_same_command_then_runs(base, tmp_path, signum):
    target = tmp_path / "shared"
    line = one_line(*command("export", signum, ["export", base / "run", target], tmp_path), signum)
    assert line.startswith(f"error: interrupted ({NAME[signum]})"), line
    assert not os.path.lexists(target) and hidden_temporaries(tmp_path) == []


def test_sigkill_during_export_leaves_no_target_and_the_retry_removes_its_temporary(base, tmp_path):
    target = tmp_path / "shared"
    code, _ = command("export", signal.SIGKILL, ["export", base / "run", target], tmp_path)
    assert code == -signal.SIGKILL and not os.path.lexists(target)  # no empty folder that refuses the retry
    assert len(hidden_temporaries(tmp_path)) == 1
    code, lines = command("none", None, ["export", base / "run", target], tmp_path)
    assert code == 0, lines[-20:]
    assert (target / "model.safetensors").is_file() and hidden_temporaries(tmp_path) == []


@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_a_signal_during_evaluation_is_one_line(base, tmp_path, signum):
    argv = ["eval", base / "run", "--data", base / "photos", "--features", "random", "--num", 16,
            "--out", tmp_path / "scores.json"]
    line = one_line(*command("eval", signum, argv, tmp_path), signum)
    assert line.startswith(f"error: interrupted ({NAME[signum]})"), line
    assert not (tmp_path / "scores.json").exists() and hidden_temporaries(tmp_path) == []


def test_sigkill_in_training_before_the_first_checkpoint_then_the_same_command_finishes(base, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--data", base / "photos", "--output-dir", out, "--steps", 4, *TINY]
    code, _ = command("train", signal.SIGKILL, argv, tmp_path)  # after step 2's metrics, before its checkpoint
    assert code == -signal.SIGKILL and not (out / "checkpoints").exists() and (out / "config.json").is_file()
    code, lines = command("none", None, argv, tmp_path)
    assert code == 0, lines[-20:]
    assert [json.loads(line)["event"] for line in (out / "history.jsonl").read_text().splitlines()] == \
        ["start", "restart", "start"]
    assert (out / "checkpoints" / "checkpoint_00000004" / "COMPLETE").is_file() and hidden_temporaries(out) == []


# -- one process of a two-process launch killed ------------------------------------------------------------
# The launches' collective timeout: above the time a process is held at its stage while the other launch's test
# runs (else its partner times out first, says so in the store, and no longer counts as the one gone); a killed
# partner is seen at once (its connection closes), not after this.
HELD = 300


class Launch:
    """``gan-accel train`` as two gloo processes (rank 0 serves the store; no launcher, so the test sees each exit),
    process ``paused`` held at ``stage``; READY holds the paused one's pid, READY.go lets it go on."""

    def __init__(self, stage: str, paused: int, base: Path, photos: Path) -> None:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        base.mkdir()
        self.out, self.paused, self.base = base / "run", paused, base
        self.argv = ["train", "--data", photos, "--output-dir", self.out, "--steps", 4, *TINY]
        self.ready = base / "ready"
        self.procs = []
        for rank in (0, 1):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "TORCHELASTIC_"))}
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                       STAGE_RANK=str(paused), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ACCELERATE_USE_CPU="1",
                       OMP_NUM_THREADS="1", GAN_ACCEL_CACHE=str(base / "cache"), HF_HUB_OFFLINE="1",
                       PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
            self.procs.append(subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "stage_driver.py"), stage, str(self.ready), "--",
                 *map(str, self.argv), "--collective-timeout", str(HELD)], env=env, cwd=base, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True))

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 240
        while not self.ready.exists() and self.procs[self.paused].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.ready.exists(), self.procs[self.paused].communicate(timeout=60)[0][-3000:]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def launches(base, tmp_path_factory):
    """Both launches, started at once (their processes mostly wait: on imports, then on each other)."""
    root = tmp_path_factory.mktemp("launches")
    started = {"train": Launch("train", 0, root / "train", base / "photos"),
               "checkpoint": Launch("checkpoint", 0, root / "checkpoint", base / "photos")}
    yield started
    for one in started.values():
        one.close()


@pytest.mark.parametrize("stage", ["train", "checkpoint"])
def test_one_process_of_a_launch_killed_ends_the_other_in_one_line_and_the_retry_runs(launches, stage):
    """train: process 0, the lock's holder and the store's server, killed before the first checkpoint; the requeued
    command then starts the run again. checkpoint: process 1 killed while process 0 writes the first checkpoint,
    which is complete and named. The launcher's SIGTERM reaches the survivor, in the second case while it works
    out its line."""
    run = launches[stage]
    run.wait_ready()
    killed = 0 if stage == "train" else 1
    killed_at = time.monotonic()
    run.procs[killed].kill()
    survivor = run.procs[1 - killed]
    if stage == "checkpoint":
        run.ready.with_name(f"{run.ready.name}.go").write_text("go")  # process 0 completes the checkpoint
    time.sleep(0.05 if stage == "train" else 1.0)  # checkpoint: while it waits to see who else is gone
    survivor.send_signal(signal.SIGTERM)  # what torchrun does once a worker died
    text = survivor.communicate(timeout=40)[0]
    ends = [line for line in text.splitlines() if line.startswith(("gan_accel: error:", "error:"))]
    assert survivor.returncode == 75 and time.monotonic() - killed_at < 40, text[-3000:]
    assert len(ends) == 1 and "Traceback" not in text and "frame #" not in text, text[-3000:]
    assert ends[0].startswith(f"gan_accel: error: process {killed} ended or lost its connection; stopping at step ")
    if stage == "train":
        assert ends[0].endswith("No checkpoint of this run was written: the same command starts it again, "
                                "replacing what it wrote."), ends
        code, lines = command("none", None, [*run.argv, "--resume", "auto"], run.base)  # the requeued job's command
        assert code == 0, lines[-20:]
        assert (run.out / "checkpoints" / "checkpoint_00000004" / "COMPLETE").is_file()
    else:
        named = ends[0].split("The last complete checkpoint is ", 1)[1].split(";", 1)[0]
        assert Path(named) == run.out / "checkpoints" / "checkpoint_00000002" and (Path(named) / "COMPLETE").is_file()
    assert hidden_temporaries(run.out) == []
