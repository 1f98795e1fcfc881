"""The ``gan-accel`` command on runs of their own: ``info`` on a resumed run (its history) and on a run in
progress (read without writing), the model line of ``info``, ``--debug`` before or after the command,
``--help`` for each command, and ``sample --no-ema`` on a run without an EMA.

Checked against the files the runs wrote (``metrics.jsonl``, the checkpoints) and the run's own generator.
The runs and the in-process command come from tests/cli_runs.py; the tests that share trained runs are in
tests/test_cli.py.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch

from gan_accel.callbacks import Callback
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.cli import main
from cli_runs import CK2, cli, snapshot, the_same_latents, train


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "raw"
    return out, train(out, steps=2, ema=None)


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """2 steps, then resumed to 4 steps."""
    out = tmp_path_factory.mktemp("cli") / "resumed"
    train(out, steps=2)
    train(out, resume_from="latest")
    return out


def test_no_ema_on_a_run_without_an_ema_samples_its_g_with_a_note(raw_run, tmp_path, capsys):
    run, trainer = raw_run
    code, out, err = cli(["sample", run, "--no-ema", "--num", 4, "--out", tmp_path / "a.npz"], capsys)
    assert code == 0 and not err
    assert f"note: {run} kept no EMA of G: its samples always come from the raw G, so --no-ema changes nothing" in out
    assert cli(["sample", run, "--num", 4, "--out", tmp_path / "b.npz"], capsys)[0] == 0
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    with torch.no_grad():
        G = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.G)).eval()
        torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "a.npz")["images"]), G(the_same_latents(4, 0)))


@pytest.mark.parametrize("command", ["sample", "eval", "info", "plot"])
def test_help_for_each_command(command, capsys):
    code, out, _ = cli([command, "--help"], capsys)
    assert code == 0 and out.startswith(f"usage: gan-accel {command}")
    code, out, _ = cli(["--help"], capsys)
    assert code == 0 and command in out


# -- info ------------------------------------------------------------------------------------------
def test_info_shows_the_history(resumed_run, capsys):
    code, out, _ = cli(["info", resumed_run, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and [e["event"] for e in report["history"]] == ["start", "resume"]
    resume = report["history"][1]
    assert resume["step"] == 2 and resume["changes"] == {"max_steps": [2, 4]} and "config" not in report["history"][0]
    assert [r["step"] for r in read_metrics(resumed_run / "metrics.jsonl")] == [1, 2, 3, 4]
    code, text, _ = cli(["info", resumed_run], capsys)
    assert f"resume at step 2 from {CK2}: max_steps 2 -> 4" in text


class InfoDuringTraining(Callback):
    """Runs ``gan-accel info`` on the run folder at step 3 (the trainer holds the folder's lock)."""

    def __init__(self, capsys) -> None:
        self.capsys, self.seen = capsys, None

    def on_step_end(self, trainer) -> None:
        if trainer.step != 3:
            return
        before = snapshot(trainer.output_dir)
        self.capsys.readouterr()
        code = main(["info", str(trainer.output_dir), "--json"])
        self.seen = (code, json.loads(self.capsys.readouterr().out), before == snapshot(trainer.output_dir))
        assert main(["info", str(trainer.output_dir)]) == 0


def test_info_reads_a_run_in_progress_and_writes_nothing(tmp_path, capsys):
    watcher = InfoDuringTraining(capsys)
    train(tmp_path / "run", steps=6, callbacks=[watcher])
    code, report, unchanged = watcher.seen
    assert code == 0 and unchanged
    assert report["status"]["state"] == "running" and report["status"]["holder"]["pid"] == os.getpid()
    assert report["steps"]["done"] == 2 and report["steps"]["latest_checkpoint"] == 2  # row 3 is logged after the step
    assert report["export"] is None and [c["name"] for c in report["checkpoints"]] == [CK2]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_before_or_after_the_command_shows_the_traceback(where, tmp_path):
    argv = ["info", str(tmp_path / "nowhere")]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    from gan_accel.cli.common import CommandError

    with pytest.raises(CommandError, match="nowhere does not exist"):
        main(argv)


def test_info_names_the_model_family_and_a_conditional_runs_classes():
    from gan_accel.cli.info import _config_line

    model = {"family": "resnet", "width": 8, "image_size": 32, "channels": 3, "num_classes": 5}
    lines = _config_line({"model": model}, {"dataset": "pets"})
    assert lines[-1] == "model: resnet, conditional on 5 classes, width 8, 32x32x3, data pets"
