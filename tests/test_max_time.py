"""How long a run takes: the time limit (``max_time`` / ``--max-time``) and the measured estimate.

A run that reaches its time limit stops cleanly at a step end, with a checkpoint and the final generator,
and ``--resume latest`` continues it bitwise as if it had never stopped; the estimate line projects the
run from its measured speed, once.
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from conftest import reset_accelerate_state
from gan_accel import TrainConfig
from gan_accel.callbacks import progress
from gan_accel.cli.arguments import duration
from gan_accel.text import describe_duration
from test_resume import assert_identical, build_trainer, snapshot


def test_the_time_limit_stops_cleanly_and_the_resumed_run_is_the_uninterrupted_one(tmp_path, capsys):
    straight = build_trainer(str(tmp_path / "straight"))
    straight.fit()
    expected = snapshot(straight)
    reset_accelerate_state()
    # A limit already passed when the first step ends: the stop is at step 1, whatever the machine's speed.
    stopped = build_trainer(str(tmp_path / "run"), max_time=1e-9)
    stopped.fit()
    assert stopped.step == 1
    line = capsys.readouterr().out
    assert "stopped at the time limit" in line and "at step 1 of 8" in line and "--resume latest" in line
    run = tmp_path / "run"
    assert (run / "checkpoints" / "checkpoint_00000001").is_dir()
    assert json.loads((run / "generator" / "config.json").read_text())["weights"]["step"] == 1
    reset_accelerate_state()
    resumed = build_trainer(str(run))  # no limit this time: on to max_steps
    resumed.fit(resume_from="latest")
    assert resumed.step == 8
    assert_identical(snapshot(resumed), expected)
    assert json.loads((run / "generator" / "config.json").read_text())["weights"]["step"] == 8


def test_the_estimate_is_one_line_from_the_measured_speed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "MEASURE_SECONDS", 0.0)  # estimate at the first timed step
    trainer = build_trainer(str(tmp_path / "run"), max_steps=40, max_time=3600.0)
    trainer.fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if "steps ≈" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("gan_accel: 40 steps ≈ ") and "images/s on 1 process" in lines[0]
    assert "to go" in lines[0] and "time limit" not in lines[0]  # an hour is more than this run needs


def test_the_estimate_says_where_the_time_limit_ends_the_run():
    config = TrainConfig(max_steps=5000, batch_size=64, max_time=600.0)
    trainer = argparse.Namespace(config=config, step=1000, images_per_step=64,
                                 accelerator=argparse.Namespace(num_processes=2))
    line = progress.estimate(trainer, steps_per_second=2.0, time_left=500.0)
    assert line.startswith("5,000 steps ≈ 42 min at 128 images/s on 2 processes")
    assert "4,000 to go, about 33 min" in line and "stops it near step 2,000" in line


@pytest.mark.parametrize("text, seconds", [("5400", 5400), ("90m", 5400), ("2h", 7200), ("1h30m", 5400),
                                           ("45s", 45), ("10 min", 600), ("1d", 86400), ("2.5h", 9000)])
def test_durations_read_as_people_write_them(text, seconds):
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "2x", "0", "h", "-5", "1..5", "1.5.5", "1h30", "30m1h", "2h2h", "1 2",
                                  "5.", ".5h", "1hm"])
def test_a_duration_that_is_not_one_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


def test_durations_are_described_as_people_read_them():
    assert [describe_duration(s) for s in (4, 59, 59.7, 60, 14 * 60 + 20, 7200, 7500)] == \
        ["4 s", "59 s", "1 min", "1 min", "14 min", "2 h", "2 h 5 min"]


def test_max_time_must_be_positive():
    with pytest.raises(Exception, match="max_time=0"):
        TrainConfig(max_time=0).validate()
