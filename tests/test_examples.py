"""examples/custom_modules.py and examples/toy_2d.py, end to end with small settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from gan_accel.callbacks.metrics_log import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_custom_modules_example_trains_its_own_networks_loss_phase_and_callback(tmp_path):
    out = tmp_path / "run"
    result = run(["examples/custom_modules.py", "--dataset", "digits", "--data-dir", str(tmp_path / "nodata"),
                  "--output-dir", str(out), "--steps", "6", "--batch-size", "8", "--width", "8", "--z-dim", "8",
                  "--sample-every", "3", "--log-every", "3", "--no-progress"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [3, 6]
    assert {"loss/D", "loss/G", "loss/E", "D(x)", "D(G(z))"} <= set(rows[-1])  # its own phases and metrics
    for step in (3, 6):  # the user callback's pictures: 6 interpolations of 8 points
        with Image.open(out / f"interpolation_{step:06d}.png") as image:
            assert image.size == (8 * 30 + 2, 6 * 30 + 2)
    assert "encoder latent error" in result.stdout
    assert (out / "generator" / "model.safetensors").exists() and (out / "samples_final.png").exists()


def test_toy_2d_example_writes_scatter_plots_and_its_evaluation(tmp_path):
    out = tmp_path / "run"
    result = run(["examples/toy_2d.py", "--output-dir", str(out), "--steps", "40", "--sample-every", "20",
                  "--log-every", "20", "--num-eval", "500", "--seed", "3", "--no-progress"])
    assert result.returncode == 0, result.stderr[-3000:]
    evaluation = json.loads((out / "eval.json").read_text())
    assert evaluation["num_samples"] == 500 and evaluation["num_modes"] == 8 and evaluation["seed"] == 3
    assert 0 <= evaluation["modes"] <= 8 and 0.0 <= evaluation["high_quality"] <= 1.0
    assert f"{evaluation['modes']}/8 modes" in result.stdout
    with Image.open(out / "samples_000040.png") as plot:
        assert plot.size == (480, 480)
    with Image.open(out / "progress.gif") as gif:
        assert gif.n_frames == 2
