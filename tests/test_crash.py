"""Never lose a run: SIGKILL mid-training or mid-save, SIGTERM and SIGINT, then resume and finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.storage.layout import read_json_lines

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DRIVER = str(ROOT / "tests" / "crash_driver.py")
EXAMPLE = str(ROOT / "examples" / "dcgan_mnist.py")
FLAGS = ["--dataset", "digits", "--steps", "12", "--batch-size", "8", "--width", "8", "--log-every", "1",
         "--sample-every", "4", "--checkpoint-every", "4", "--keep-checkpoints", "3", "--no-progress"]


def start(mode: str, step: int, out: Path) -> subprocess.Popen:
    """``crash_driver.py MODE STEP`` on the example in a process of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    args = [sys.executable, DRIVER, mode, str(step), "--", "--data-dir", str(out.parent / "nodata"),
            "--output-dir", str(out), *FLAGS]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


FAULTS = {"kill-train": 6, "kill-save": 8}


@pytest.fixture(scope="module")
def faulty_runs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Both killed runs at once (each mostly waits on its imports: on two cores together they take about the time
    of one); per mode, its run folder and its finished process."""
    base = tmp_path_factory.mktemp("faults")
    procs = {mode: start(mode, step, base / mode / "run") for mode, step in FAULTS.items()}
    done = {}
    for mode, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        done[mode] = (base / mode / "run", subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def example_main(out: Path, capsys, *flags: str) -> tuple[int, str, str]:
    """``python examples/dcgan_mnist.py FLAGS`` with the faulty runs' flags, in this process (only a SIGKILL needs a
    process of its own): (exit code, stdout, stderr)."""
    import importlib.util

    from conftest import reset_accelerate_state

    spec = importlib.util.spec_from_file_location("example_dcgan_mnist", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    capsys.readouterr()
    reset_accelerate_state()
    try:
        code = example.main([*flags, "--data-dir", str(out.parent / "nodata"), "--output-dir", str(out), *FLAGS])
    finally:
        reset_accelerate_state()
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def resume(out: Path, capsys) -> tuple[int, str, str]:
    return example_main(out, capsys, "--resume", "latest")


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def logged_steps(out: Path) -> list[int]:
    return [row["step"] for row in read_metrics(out / "metrics.jsonl")]


@pytest.mark.parametrize("mode, step, survivors", [
    ("kill-train", 6, ["checkpoint_00000004"]),  # killed between checkpoints 4 and 8
    ("kill-save", 8, [".tmp-checkpoint_00000008", "checkpoint_00000004"]),  # killed while writing 8
])
def test_sigkill_then_resume_finishes_with_a_clean_log(faulty_runs, capsys, mode, step, survivors):
    assert FAULTS[mode] == step
    out, crashed = faulty_runs[mode]
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert checkpoints(out) == survivors
    code, stdout, stderr = resume(out, capsys)
    assert code == 0, stderr[-3000:]
    assert "resumed from" in stdout and "checkpoint_00000004" in stdout
    assert logged_steps(out) == list(range(1, 13)), "no duplicated or missing steps after resume"
    # The partial folder is gone; every remaining checkpoint is complete.
    current = checkpoints(out)
    assert current == ["checkpoint_00000004", "checkpoint_00000008", "checkpoint_00000012"]
    assert all((out / "checkpoints" / name / "COMPLETE").is_file() for name in current)
    # The rows the crashed run logged after its checkpoint stay in the log (only ever appended to); the redone
    # rows supersede them for every reader.
    logged = [row["step"] for row in read_json_lines(out / "metrics.jsonl")[0]]
    before_crash = len(logged) - 8
    assert logged == list(range(1, before_crash + 1)) + list(range(5, 13)) and before_crash in (step - 1, step)
    assert (out / "generator" / "model.safetensors").is_file() and (out / "progress.gif").is_file()


def test_sigterm_checkpoints_and_exits_nonzero_with_resume_instructions(tmp_path, capsys, monkeypatch):
    """SIGTERM arrives during step 6 (sent by the process to itself, as crash_driver.py's sigterm mode does)."""
    from gan_accel.ending import SignalHandler

    original_check = SignalHandler.on_step_end

    def signal_then_check(self, trainer):
        if trainer.step == 6:
            os.kill(os.getpid(), signal.SIGTERM)  # noticed at the end of the step
        original_check(self, trainer)

    monkeypatch.setattr(SignalHandler, "on_step_end", signal_then_check)
    out = tmp_path / "run"
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        code, _, stderr = example_main(out, capsys)
    finally:  # the script's stop leaves handlers that end the process on a late signal: not this one's
        for signum, handler in before.items():
            signal.signal(signum, handler)
    assert code == 128 + signal.SIGTERM, stderr[-2000:]
    assert "stopped by SIGTERM at step 6" in stderr and "--resume latest" in stderr
    monkeypatch.undo()
    assert checkpoints(out) == ["checkpoint_00000004", "checkpoint_00000006"]
    code, _, stderr = resume(out, capsys)
    assert code == 0, stderr[-3000:]
    assert logged_steps(out) == list(range(1, 13))


def test_sigint_in_process_raises_training_interrupted_after_a_checkpoint(tmp_path):
    """The API path: fit() turns Ctrl-C into a checkpoint and TrainingInterrupted (exit code 130)."""
    from conftest import make_images, make_loader, make_models, TableLatents
    from gan_accel import GANTrainer, TrainConfig, TrainingInterrupted, list_checkpoints

    G, D = make_models()
    config = TrainConfig(max_steps=10, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4,
                         checkpoint_every=100, output_dir=str(tmp_path / "run"), progress_bar=False)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), config, latent_sampler=TableLatents(4096))
    from gan_accel import Callback

    class InterruptAtStep3(Callback):
        def on_step_end(self, trainer):
            if trainer.step == 3:
                os.kill(os.getpid(), signal.SIGINT)

    trainer.callbacks.add(InterruptAtStep3(), before="signal_handler")
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job
    with pytest.raises(TrainingInterrupted, match="stopped by SIGINT at step 3") as info:
        trainer.fit()
    assert info.value.exit_code == 130
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint_00000003"]
    assert signal.getsignal(signal.SIGINT) is before, "handlers must be restored"
