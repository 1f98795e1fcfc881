"""examples/dcgan_mnist.py end to end: one process, two gloo processes, two "machines", bad launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import mnist_dir, free_port
from test_current_names import DEPRECATED
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.storage.run_folder import read_fixed_latents

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "dcgan_mnist.py")
TINY = ["--steps", "4", "--batch-size", "8", "--width", "8", "--sample-every", "2", "--log-every", "2",
        "--no-progress", "--ema-decay", "0.9"]


def env(**extra) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    base.update(OMP_NUM_THREADS="1", **extra)
    return base


def run(cmd: list[str], timeout: int = 300, **env_extra) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**env_extra), cwd=ROOT)


def check_run_folder(out: Path, steps: int, dataset: str) -> None:
    """Every output file is valid: images open, the weights load back and sample."""
    from gan_accel.storage.weights import load_weights
    from gan_accel.models import build_generator

    grids = sorted(out.glob("samples_0*.png"))
    assert [p.name for p in grids] == [f"samples_{s:06d}.png" for s in range(2, steps + 1, 2)]
    for png in [*grids, out / "samples_final.png"]:
        with Image.open(png) as image:
            assert image.format == "PNG" and image.size[0] > 28
    with Image.open(out / "progress.gif") as gif:
        assert gif.format == "GIF" and gif.n_frames == len(grids)
    config = json.loads((out / "config.json").read_text())
    assert config["extra"]["dataset"] == dataset and config["max_steps"] == steps
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(2, steps + 1, 2))
    model = config["model"]  # the spec gan-accel sample rebuilds G from
    G = load_weights(build_generator(model), out / "generator" / "model.safetensors")
    assert json.loads((out / "generator" / "config.json").read_text())["weights"]["step"] == steps
    labels = (torch.tensor([0, 4, 9]),) if config["num_classes"] else ()
    with torch.no_grad():
        images = G.eval()(torch.randn(3, model["z_dim"]), *labels)
    assert images.shape == (3, 1, 28, 28) and images.abs().max() <= 1


def dcgan_mnist(monkeypatch):
    """The example's module, imported in this process: its ``main`` runs a command line without a process start
    (the ``digits_run`` fixture runs it as a script)."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setattr(sys, "argv", [EXAMPLE])  # the parser's name in its messages
    import dcgan_mnist as module

    return module


def test_help_documents_the_flags_and_a_bad_flag_fails_before_any_work(tmp_path, monkeypatch, capsys):
    example = dcgan_mnist(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        example.main(["--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    for flag in ("--data-dir", "--output-dir", "--steps", "--epochs", "--batch-size", "--lr-g", "--lr-d",
                 "--grad-accum", "--mixed-precision", "--sample-every", "--seed", "--width"):
        assert flag in shown, flag
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        example.main(["--dataset", "digits", "--output-dir", str(out), "--lr-g", "-1"])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [
        "error: argument --lr-g: '-1' is not a number > 0 (see dcgan_mnist.py --help)"]
    assert not out.exists()


@pytest.mark.skipif(mnist_dir() is None, reason="real MNIST not found: set GAN_ACCEL_MNIST_DIR")
def test_trains_on_real_mnist_and_writes_valid_outputs(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert dcgan_mnist(monkeypatch).main(["--data-dir", mnist_dir(), "--dataset", "mnist", "--output-dir", str(out),
                                         *TINY]) == 0
    check_run_folder(out, 4, "mnist")


def test_trains_on_offline_digits_and_writes_valid_outputs(digits_run):
    check_run_folder(digits_run.out, 4, "offline-digits")


def test_conditional_example_on_two_gloo_processes(tmp_path, capsys):
    """examples/conditional_mnist.py under accelerate launch: both ranks train one model on batches of the
    configured per-process size, the labels reach D and G, the grids have one row per digit, one set of
    outputs, and the run samples a chosen digit afterwards."""
    out = tmp_path / "run"
    example = str(ROOT / "examples" / "conditional_mnist.py")
    result = run(["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                  "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                  example, "--dataset", "digits", "--data-dir", str(tmp_path / "nodata"), "--output-dir", str(out),
                  "--r1-gamma", "0.1", *TINY], ACCELERATE_USE_CPU="1",  # R1: a double backward through DDP
                 PYTHONWARNINGS="always::DeprecationWarning,always::FutureWarning")  # shown, not hidden or once
    assert result.returncode == 0, result.stderr[-3000:]
    # No warning of ours in a 2-process launch, and its first line names the launch in words (test_current_names.py)
    from test_current_names import DEPRECATED

    assert "FutureWarning" not in result.stderr and "DeprecationWarning" not in result.stderr, result.stderr[-3000:]
    assert not any(name in result.stderr + result.stdout for name in DEPRECATED), result.stderr[-3000:]
    assert "; 2 processes (DDP, gloo) on cpu; " in result.stdout.splitlines()[0], result.stdout[:500]
    for rank in (0, 1):  # 4 steps x 8 images each
        assert f"process {rank}/2: 4 steps, 32 images in batches of 8" in result.stdout
    assert result.stdout.count("gan_accel: offline-digits") == 1, "banner only from the main process"
    # channels_last (the default) and R1's double backward: DDP's bucket views take every gradient as they are
    assert "Grad strides do not match" not in result.stderr + result.stdout
    check_run_folder(out, 4, "offline-digits")  # one set of outputs
    config = json.loads((out / "config.json").read_text())
    assert config["extra"]["num_processes"] == 2
    assert config["num_classes"] == 10 and config["model"]["num_classes"] == 10  # a conditional G and D
    assert torch.equal(read_fixed_latents(out)[1], torch.arange(10).repeat_interleave(10))
    with Image.open(out / "samples_final.png") as grid:
        assert grid.size == (10 * 30 + 2, 10 * 30 + 2)  # 10 digits x 10 samples
    sample = gan_accel_command(["sample", str(out), "--label", "7", "--num", "5", "--format", "npz",
                                "--out", str(tmp_path / "sevens.npz")], capsys)
    assert sample.returncode == 0, sample.stderr
    import numpy as np

    arrays = np.load(tmp_path / "sevens.npz")
    assert arrays["images"].shape == (5, 1, 28, 28) and arrays["labels"].tolist() == [7] * 5


def test_two_single_process_machines_on_localhost(tmp_path):
    out, port = tmp_path / "run", str(free_port())
    procs = []
    for machine_rank in (0, 1):
        cmd = ["accelerate", "launch", "--multi_gpu", "--num_machines", "2", "--machine_rank", str(machine_rank),
               "--num_processes", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", port,
               "--mixed_precision", "no", "--dynamo_backend", "no", EXAMPLE, "--dataset", "digits",
               "--data-dir", str(tmp_path / "nodata"), "--output-dir", str(out), *TINY]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env(ACCELERATE_USE_CPU="1"), cwd=ROOT))
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (stdout, stderr) in zip(procs, outputs):
        assert proc.returncode == 0, stderr[-3000:]
    assert "process 0/2: 4 steps, 32 images in batches of 8" in outputs[0][0]
    assert "process 1/2: 4 steps, 32 images in batches of 8" in outputs[1][0]
    check_run_folder(out, 4, "offline-digits")


def test_multi_gpu_launch_without_gpus_stops_with_a_clear_message(tmp_path, monkeypatch, capsys):
    """What each process of `accelerate launch --multi_gpu` sees without ACCELERATE_USE_CPU on a machine without
    GPUs (WORLD_SIZE=2, no distributed Accelerator): it would silently train a duplicate; the example refuses."""
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: the launch would be genuinely distributed")
    example = dcgan_mnist(monkeypatch)
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "run"
    assert example.main(["--dataset", "digits", "--data-dir", str(tmp_path / "nodata"), "--output-dir", str(out),
                         *TINY]) != 0
    assert "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu" in capsys.readouterr().err
    assert not (out / "metrics.jsonl").exists(), "nothing may train"


def test_two_gpu_config_file_is_valid_for_accelerate():
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(ROOT / "examples" / "accelerate_2gpu.yaml"))
    assert config.distributed_type.value == "MULTI_GPU" and config.num_processes == 2 and config.num_machines == 1


def gan_accel_command(argv: list[str], capsys) -> subprocess.CompletedProcess:
    """``gan-accel ARGS`` through ``gan_accel.cli.main`` (what the installed command calls) in this process:
    each command in a process of its own would spend most of its time importing torch (tests/test_cli.py
    runs ``python -m gan_accel.cli`` as a process)."""
    from conftest import reset_accelerate_state
    from gan_accel.cli import main

    capsys.readouterr()
    reset_accelerate_state()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    finally:
        reset_accelerate_state()
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["gan-accel", *argv], code, captured.out, captured.err)


def test_cli_samples_from_a_finished_run(digits_run, tmp_path, capsys):
    out = digits_run.out
    result = gan_accel_command(["sample", str(out), "--num", "9", "--out", str(tmp_path / "g.png")], capsys)
    assert result.returncode == 0, result.stderr[-2000:]
    with Image.open(tmp_path / "g.png") as grid:
        assert grid.size == (3 * 30 + 2, 3 * 30 + 2)  # 3x3 grid of 28px images with 2px padding
    missing = gan_accel_command(["sample", str(tmp_path / "nowhere"), "--out", str(tmp_path / "h.png")], capsys)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ")
    assert "nowhere does not exist" in missing.stderr


def test_evaluation_during_training_and_gan_accel_eval_on_the_offline_digits(digits_run, tmp_path, monkeypatch,
                                                                             capsys):
    """--eval-every logs eval/* rows and names the best checkpoint; `gan-accel eval` scores the run against
    the set it trained on and says that it is not MNIST; an existing --out is never overwritten."""
    out, cache = digits_run.out, digits_run.cache
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "eval/fd" in r]
    assert [r["eval/step"] for r in rows] == [2, 4]
    assert {"eval/kid", "eval/precision", "eval/recall", "eval/is"} <= set(rows[0])
    best = json.loads((out / "best.json").read_text())
    best_fd = min(r["eval/fd"] for r in rows)
    assert best["value"] == best_fd and (out / best["checkpoint"]).is_dir()

    scores = tmp_path / "scores.json"
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(cache))
    evaluate = gan_accel_command(["eval", str(out), "--num", "200", "--out", str(scores)], capsys)
    assert evaluate.returncode == 0, evaluate.stderr[-2000:]
    assert "NOT MNIST" in evaluate.stdout.splitlines()[0]
    report = json.loads(scores.read_text())
    assert report["reference"] == "offline-digits" and report["num_samples"] == 200 and report["step"] == 4
    assert {"fd", "kid", "precision", "recall", "class_share", "mean_confidence"} <= set(report)
    again = gan_accel_command(["eval", str(out), "--out", str(scores)], capsys)
    assert again.returncode == 2 and again.stderr.startswith("error:") and "exists" in again.stderr
    assert json.loads(scores.read_text()) == report


# The first line in words and no DDP deprecation warning of ours (tests/test_current_names.py has the rest;
# this test shares the digits_run fixture with the tests above, so it runs beside them on one test worker).
def test_the_quickstart_says_its_launch_in_words_and_refuses_a_poisoned_resume(digits_run, tmp_path, monkeypatch,
                                                                              capsys):
    """examples/dcgan_mnist.py: the first line names the launch for people; --resume latest of a checkpoint with
    a payload in an optimizer file ends with one error line naming it (exit 2), and the payload never ran."""
    import shutil

    from conftest import reset_accelerate_state
    from test_safe_loading import plant

    line = digits_run.stdout.splitlines()[0]
    assert "; 1 process on cpu; " in line and "NO on" not in line, line
    assert not any(name in digits_run.stderr for name in DEPRECATED), digits_run.stderr[-2000:]
    out, marker = tmp_path / "run", tmp_path / "PAYLOAD_RAN"
    shutil.copytree(digits_run.out, out)
    victim = out / "checkpoints" / "checkpoint_00000004" / "optimizer.bin"
    plant(victim, marker)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(digits_run.cache))
    import dcgan_mnist

    reset_accelerate_state()
    capsys.readouterr()
    code = dcgan_mnist.main(["--dataset", "digits", "--data-dir", str(tmp_path / "nodata"), "--output-dir", str(out),
                             "--steps", "6", "--batch-size", "8", "--width", "8", "--sample-every", "2", "--log-every",
                             "2", "--no-progress", "--ema-decay", "0.9", "--eval-every", "2", "--eval-samples", "60",
                             "--resume", "latest"])
    stderr = capsys.readouterr().err
    errors = [row for row in stderr.splitlines() if row.strip()]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("error: "), stderr[-3000:]
    assert str(victim) in errors[0] and "could run code" in errors[0]
    assert not marker.exists()


def test_a_resumed_example_keeps_the_settings_its_run_recorded(tmp_path, monkeypatch, capsys):
    """Resumed without the flags it started with, the example continues the run as it was (the loss, the rates
    and the length its config.json recorded), as gan-accel train does; a flag given still changes a rate."""
    import json

    from conftest import reset_accelerate_state

    example = dcgan_mnist(monkeypatch)
    out = tmp_path / "run"
    first = ["--dataset", "digits", "--output-dir", str(out), "--batch-size", "8", "--width", "4",
             "--sample-every", "2", "--checkpoint-every", "2", "--log-every", "1", "--no-progress"]
    assert example.main([*first, "--steps", "4", "--loss", "hinge", "--lr-g", "0.001"]) == 0
    reset_accelerate_state()
    assert example.main(["--dataset", "digits", "--output-dir", str(out), "--resume", "latest", "--lr-d", "0.002",
                         "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["loss"], config["lr_G"], config["lr_D"], config["batch_size"]) == ("hinge", 0.001, 0.002, 8)
    assert config["model"]["width"] == 4 and config["max_steps"] == 4
    assert "resumed from" in capsys.readouterr().out
