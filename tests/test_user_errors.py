"""Every user mistake is one ``error:`` line with exit code 2; write failures keep the last checkpoint.

The example scripts and the ``gan-accel`` command are run as a user would (in-process through their
``main`` where that is enough, as subprocesses for file-size limits and two runs at once), and their
output is checked line by line: no traceback unless ``--debug``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import reset_accelerate_state
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.storage.run_folder import read_history

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dcgan_mnist.py"
TINY = ["--dataset", "digits", "--batch-size", "8", "--width", "8", "--log-every", "1", "--sample-every", "4",
        "--checkpoint-every", "4", "--no-progress"]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def run_main(module, argv, capsys) -> tuple[int, str]:
    reset_accelerate_state()
    try:
        code = module.main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    return code, one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("flags, says", [
    (["--epochs", "0"], "--epochs: '0' is not a number > 0"),
    (["--steps", "-3"], "--steps: '-3' is not a whole number >= 1"),
    (["--batch-size", "eight"], "--batch-size: 'eight' is not a whole number >= 1"),
    (["--beta1", "1.5"], "--beta1: '1.5' is not a number in [0, 1)"),
    (["--lr-g", "nan"], "--lr-g: 'nan' is not a number > 0"),
    (["--mixed-precision", "fp8"], "invalid choice: 'fp8'"),
    (["--steps", "2", "--stepz", "3"], "unrecognized arguments: --stepz 3"),
])
def test_bad_flags_are_one_line_before_any_work(tmp_path, capsys, flags, says):
    code, line = run_main(load_example("dcgan_mnist"), [*flags, "--output-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and says in line and "--help" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mistake", ["resume-missing", "loss", "under-a-file", "foreign-checkpoint", "changed-batch"])
def test_run_mistakes_are_one_line_naming_the_fix(tmp_path, capsys, mistake):
    example = load_example("dcgan_mnist")
    out = tmp_path / "run"
    flags = [*TINY, "--steps", "4", "--output-dir", str(out), "--data-dir", str(tmp_path / "nodata")]
    if mistake in ("foreign-checkpoint", "changed-batch"):
        assert run_main_ok(example, flags, capsys) == 0
    if mistake == "resume-missing":
        flags += ["--resume", str(tmp_path / "nope")]
        expected = "does not exist: pass a checkpoint folder or 'latest'"
    elif mistake == "loss":
        flags += ["--loss", "wgan"]
        expected = "loss='wgan' is unknown: choose one of"
    elif mistake == "under-a-file":
        (tmp_path / "afile").write_text("x")
        flags[flags.index(str(out))] = str(tmp_path / "afile" / "run")
        expected = "cannot use output folder"  # and the reason: Not a directory (ENOTDIR)
    elif mistake == "foreign-checkpoint":  # another run's checkpoint starts a new run: not over a folder in use
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "notes.txt").write_text("mine")
        flags[flags.index(str(out))] = str(tmp_path / "other")
        flags += ["--resume", str(out / "checkpoints" / "checkpoint_00000004")]
        expected = "starts a new run from it, in --output-dir"
    else:
        flags[flags.index("--batch-size") + 1] = "4"
        flags += ["--resume", "latest", "--steps", "8"]
        expected = "batch_size: 8 -> 4"
    code, line = run_main(example, flags, capsys)
    assert code == 2 and expected in line, line
    if mistake == "under-a-file":
        assert "Not a directory (ENOTDIR)" in line and "choose a writable output_dir" in line


def run_main_ok(module, argv, capsys) -> int:
    reset_accelerate_state()
    code = module.main(argv)
    capsys.readouterr()
    return code


def test_debug_shows_the_traceback(tmp_path):
    from gan_accel import CheckpointError

    example = load_example("dcgan_mnist")
    reset_accelerate_state()
    with pytest.raises(CheckpointError, match="does not exist"):
        example.main([*TINY, "--output-dir", str(tmp_path / "run"), "--resume", str(tmp_path / "nope"), "--debug"])


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    example = load_example("dcgan_mnist")
    monkeypatch.setattr(example, "train", lambda args: [][1])  # not a user mistake: an IndexError
    with pytest.raises(IndexError):
        example.main(["--output-dir", str(tmp_path / "run")])


# -- the gan-accel command -----------------------------------------------------------------------------
@pytest.mark.parametrize("case, says", [
    ("missing", "is not a gan_accel run folder"),
    ("corrupt", "not a readable safetensors file"),
    ("bad-num", "--num: '0' is not a whole number >= 1"),
    ("no-command", "the following arguments are required: COMMAND"),
])
def test_gan_accel_command_mistakes_are_one_line(tmp_path, capsys, case, says):
    from gan_accel.cli import main

    run = tmp_path / "run"
    run.mkdir()
    out = ["--out", str(tmp_path / "x.png")]
    argv = {"missing": ["sample", str(run), *out], "corrupt": ["sample", str(run), *out],
            "bad-num": ["sample", str(run), "--num", "0", *out], "no-command": []}[case]
    if case == "corrupt":
        (run / "generator").mkdir()
        spec = {"family": "dcgan", "z_dim": 8, "width": 4, "image_size": 28, "channels": 1, "num_classes": None}
        (run / "generator" / "config.json").write_text(json.dumps({"format": "gan_accel.generator", "weights": {}, "model": spec}))
        (run / "generator" / "model.safetensors").write_bytes(b"\x00" * 20)
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2 and says in one_error_line(capsys.readouterr().err)


# -- write failures ------------------------------------------------------------------------------------
def run_example(out: Path, *flags: str, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"

    def limit() -> None:  # in the child only: Python ignores SIGXFSZ, so a write past it fails with EFBIG
        if file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    args = [sys.executable, str(EXAMPLE), *TINY, "--data-dir", str(out.parent / "nodata"), "--output-dir", str(out),
            *flags]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT, preexec_fn=limit)


@pytest.mark.slow
def test_a_file_size_limit_keeps_the_last_checkpoint_and_says_how_to_resume(tmp_path, capsys):
    out = tmp_path / "run"
    # Only the limited run needs a process of its own (the limit is per process); the runs before and
    # after it are the same command, in this process.
    example = load_example("dcgan_mnist")
    flags = [*TINY, "--data-dir", str(tmp_path / "nodata"), "--output-dir", str(out)]
    assert run_main_ok(example, [*flags, "--steps", "4"], capsys) == 0
    kept = {p.name: p.read_bytes() for p in (out / "checkpoints" / "checkpoint_00000004").iterdir()}
    # The checkpoint files are ~0.3-0.7 MB: under a 0.4 MB limit the next checkpoint cannot be written.
    failed = run_example(out, "--steps", "8", "--resume", "latest", file_size_limit=400_000)
    assert failed.returncode == 2
    line = one_error_line(failed.stderr)
    assert "cannot write checkpoint" in line and "checkpoint_00000008" in line
    assert "File too large (EFBIG)" in line or "file-size limit of 400000 bytes" in line
    assert "The last complete checkpoint is" in line and "checkpoint_00000004" in line and "--resume latest" in line
    assert {p.name: p.read_bytes() for p in (out / "checkpoints" / "checkpoint_00000004").iterdir()} == kept
    assert not (out / "checkpoints" / "checkpoint_00000008").exists()
    # And the resume it names works once the limit is gone.
    assert run_main_ok(example, [*flags, "--steps", "8", "--resume", "latest"], capsys) == 0
    assert (out / "checkpoints" / "checkpoint_00000008" / "COMPLETE").is_file()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders; the ENOTDIR case covers it")
def test_a_read_only_folder_is_one_line(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    code, line = run_main(load_example("dcgan_mnist"), [*TINY, "--steps", "2", "--output-dir", str(locked / "run")],
                          capsys)
    assert code == 2 and "Permission denied (EACCES)" in line


# -- two runs at once ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_runs_started_at_once_in_one_folder_one_is_refused(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    # 600 steps (several seconds) outlast the difference in start-up, so the two runs overlap.
    args = [sys.executable, str(EXAMPLE), *TINY, "--steps", "600", "--log-every", "50", "--sample-every", "600",
            "--checkpoint-every", "600", "--data-dir", str(tmp_path / "nodata"), "--output-dir", str(out)]
    runs = [subprocess.Popen([*args, "--seed", str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=ROOT) for seed in (1, 2)]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, _, err in results if code == 2)
    line = one_error_line(loser)  # the lock held, or (a moment later) the winner's files already there
    assert "in use by another run (pid" in line or "holds a run: continue it with `--resume latest`" in line, line
    winner_seed = 1 if results[0][0] == 0 else 2
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == list(range(50, 601, 50)), "one run's rows"
    assert json.loads((out / "config.json").read_text())["seed"] == winner_seed
    assert [entry["event"] for entry in read_history(out)] == ["start"]
