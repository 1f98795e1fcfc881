"""examples/custom_modules.py and examples/toy_2d.py, end to end with small settings, through their ``main`` in
this process (a process of their own would spend most of its time importing torch; tests/test_example.py runs
dcgan_mnist.py as a script)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from PIL import Image

from gan_accel.callbacks.metrics_log import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], capsys) -> str:
    """``python examples/NAME.py ARGS`` as its ``main``: what it printed (it must succeed)."""
    script = ROOT / args[0]
    spec = importlib.util.spec_from_file_location(f"example_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    assert module.main(args[1:]) == 0, capsys.readouterr().err[-3000:]
    return capsys.readouterr().out


def test_custom_modules_example_trains_its_own_networks_loss_phase_and_callback(tmp_path, capsys):
    out = tmp_path / "run"
    result = run(["examples/custom_modules.py", "--dataset", "digits", "--data-dir", str(tmp_path / "nodata"),
                  "--output-dir", str(out), "--steps", "6", "--batch-size", "8", "--width", "8", "--z-dim", "8",
                  "--sample-every", "3", "--log-every", "3", "--no-progress"], capsys)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [3, 6]
    assert {"loss/D", "loss/G", "loss/E", "D(x)", "D(G(z))"} <= set(rows[-1])  # its own phases and metrics
    for step in (3, 6):  # the user callback's pictures: 6 interpolations of 8 points
        with Image.open(out / f"interpolation_{step:06d}.png") as image:
            assert image.size == (8 * 30 + 2, 6 * 30 + 2)
    assert "encoder latent error" in result
    assert (out / "generator" / "model.safetensors").exists() and (out / "samples_final.png").exists()


def test_toy_2d_example_writes_scatter_plots_and_its_evaluation(tmp_path, capsys):
    out = tmp_path / "run"
    result = run(["examples/toy_2d.py", "--output-dir", str(out), "--steps", "40", "--sample-every", "20",
                  "--log-every", "20", "--num-eval", "500", "--seed", "3", "--data", "grid", "--no-progress"], capsys)
    evaluation = json.loads((out / "eval.json").read_text())
    assert evaluation["num_samples"] == 500 and evaluation["num_modes"] == 25 and evaluation["seed"] == 3
    assert 0 <= evaluation["modes"] <= 25 and 0.0 <= evaluation["high_quality"] <= 1.0
    assert evaluation["data"] == "grid" and evaluation["reverse_kl"] >= 0
    assert f"{evaluation['modes']}/25 modes" in result
    with Image.open(out / "samples_000040.png") as plot:
        assert plot.size == (480, 480)
    with Image.open(out / "progress.gif") as gif:
        assert gif.n_frames == 2
