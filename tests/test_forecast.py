"""``gan-accel train`` on a CPU says how long the run will take before it starts, and over an hour what is faster.

Checked against independent computations: the step time measured before the run against the steps of the
real run (its metrics' images/s), and the run that measured first against one that did not, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.cli import forecast
from gan_accel.cli.forecast import expected_line, run_time_lines
from gan_accel.config import TrainConfig
from gan_accel.engine import step_timing
from gan_accel.engine.step_timing import StepTiming, _extrapolate, time_steps
from gan_accel.models import build_models, default_spec
from test_train_cli import TINY, gan_accel, own_cache, write_images  # noqa: F401 (own_cache: the fixture)

GPU = "a GPU (typically much faster; not measured here)"


# -- what is said ------------------------------------------------------------------------------------------
def test_a_run_under_a_quarter_hour_says_nothing_and_one_under_an_hour_one_line():
    assert run_time_lines(6000, 0.1, None, (32, 0.01)) == []  # 10 min: the progress line will say it soon enough
    lines = run_time_lines(6000, 0.25, None, (32, 0.01))  # 25 min
    assert lines == ["expected time: about 25 min on this machine (6,000 steps at 0.25 s each, timed just now on a "
                     "few steps of this model)"]


def test_a_run_over_an_hour_names_what_is_faster_with_its_time():
    lines = run_time_lines(6000, 1.6, None, (32, 0.1))  # 2 h 40 min
    assert lines[0].startswith("expected time: about 2 h 40 min on this machine (6,000 steps at 1.6 s each")
    assert lines[1] == ("faster: --resolution 32 (about 10 min, timed the same way), --max-time 1h (about 2,200 of "
                        f"the 6,000 steps), or {GPU}")
    assert run_time_lines(6000, 1.6, None)[1] == f"faster: --max-time 1h (about 2,200 of the 6,000 steps), or {GPU}"


def test_a_time_limit_says_where_it_stops_and_is_not_offered_again():
    lines = run_time_lines(6000, 1.6, 20.0, (32, 0.1))
    assert lines[0].endswith("; the time limit (20 s) stops it near step 12, then --resume latest continues")
    assert lines[1] == f"faster: --resolution 32 (about 10 min, timed the same way), or {GPU}"
    assert run_time_lines(6000, 1.6, 20.0)[1] == f"faster: {GPU}"
    assert "time limit" not in run_time_lines(6000, 1.6, 20_000.0)[0], "a limit past the run's end stops nothing"


# -- what is measured --------------------------------------------------------------------------------------
def test_a_batch_that_does_not_fit_the_budget_is_extrapolated_from_the_two_largest_timed():
    # a step of 0.2 s plus 0.1 s an image: the line through 4 and 8 images gives 6.6 s at 64
    assert _extrapolate([4, 8], [0.6, 1.0], 64) == pytest.approx(6.6)
    assert _extrapolate([4], [0.6], 64) == pytest.approx(9.6), "one size: in proportion"
    assert _extrapolate([4, 8], [0.6, 0.5], 64) == 0.5, "noise (a larger batch timed faster): never below the timed"
    assert _extrapolate([4, 8, 16], [0.1, 0.2, 1.0], 16) == 1.0


def test_measuring_leaves_the_random_stream_as_it_was():
    spec = default_spec("dcgan", 32, 3, width=4)
    config = TrainConfig(max_steps=10, batch_size=8, model=spec, z_dim=spec["z_dim"], loss="rpgan", r1_gamma=0.1,
                         r2_gamma=0.1, augment="diffaugment", output_dir="unused")
    G, D = build_models(spec)
    before = torch.get_rng_state()
    timing = time_steps(G, D, config, budget=0.2)
    assert torch.equal(torch.get_rng_state(), before)
    assert timing.measured_batch == 8 and timing.seconds > 0


def test_the_time_measured_before_the_run_is_that_of_its_steps(tmp_path, capsys, monkeypatch):
    """The step time measured before a real run (32 px, width 16, 16 images a step, the recipe's lazy penalties
    and DiffAugment), at its batch and extrapolated from 4 and 8 images (no budget), against that run's own speed
    over its last 30 steps: within a factor 3 (the machine may be shared; the prediction leaves out the engine's
    bookkeeping around each step)."""
    measured: list[StepTiming] = []

    def timing(G, D, config, budget=2.0):
        measured.append(time_steps(G, D, config, budget))
        with monkeypatch.context() as patch:  # no step of the run's batch: a line through 4 and 8 images
            patch.setattr(step_timing, "FULL_STEP_SECONDS", 0.0)
            measured.append(time_steps(G, D, config, budget=0.0))
        return measured[0]

    monkeypatch.setattr(step_timing, "time_steps", timing)
    write_images(tmp_path / "photos", 40, size=(32, 32))
    out = tmp_path / "run"
    code, _, err = gan_accel(["train", "--data", tmp_path / "photos", "--output-dir", out, "--steps", "60", "--width",
                              "16", "--batch-size", "16", "--log-every", "30", "--sample-every", "1000",
                              "--no-progress"], capsys)
    assert code == 0, err[-3000:]
    assert [timing.measured_batch for timing in measured] == [16, 8]
    actual = read_metrics(out / "metrics.jsonl")[-1]["images/s"] / 16  # steps/s over steps 31..60
    for timing in measured:
        assert 1 / 3 < (1 / timing.seconds) / actual < 3, (timing, actual)


def test_the_run_that_measured_first_is_the_run_that_did_not(tmp_path, capsys, monkeypatch):
    """Both lines forced (thresholds 0), so the 32-px alternative is built and timed too; then the same run with
    the timing stubbed out: the weights, optimizer states, random states, trainer states, samples and metrics are
    the same bytes (but for what differs between any two runs: the run's id, its folder, the speed)."""
    write_images(tmp_path / "photos", 16, size=(64, 64))
    monkeypatch.setattr(forecast, "SAY_ABOVE", 0.0)
    monkeypatch.setattr(forecast, "ALTERNATIVES_ABOVE", 0.0)
    runs = {}
    for name in ("measured", "not"):
        if name == "not":
            monkeypatch.setattr(step_timing, "time_steps", lambda *a, **k: StepTiming(1.0, 8, 0.0))
        out = tmp_path / name
        code, stdout, err = gan_accel(["train", "--data", tmp_path / "photos", "--output-dir", out, "--steps", "3",
                                       *TINY], capsys)
        assert code == 0, err[-3000:]
        assert "gan_accel: expected time: about" in stdout and "faster: --resolution 32 (about" in stdout
        runs[name] = run_contents(out)
    assert any("random_states" in name for name in runs["not"][0]) and len(runs["not"][0]) > 10
    differ = [name for name in runs["not"][0] if runs["measured"][0].get(name) != runs["not"][0][name]]
    assert not differ and runs["measured"][1] == runs["not"][1], differ


def run_contents(out) -> tuple[dict[str, bytes], list[dict]]:
    """A run folder's checkpoints, generator and samples as bytes (the trainer's state without the run's id and
    folder) and its metrics rows without images/s; the training plot, which draws images/s, is left out."""
    from gan_accel.storage.safe_tree import load_tree, tree_bytes

    contents = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != "training_plot.png"):
        if path.suffix not in (".safetensors", ".bin", ".pkl", ".png"):
            continue
        if path.name.startswith("gan_accel_state"):
            state = load_tree(path)
            state.pop("run_id"), state["config"].pop("output_dir")
            contents[path.relative_to(out).as_posix()] = tree_bytes(state)
        else:
            contents[path.relative_to(out).as_posix()] = path.read_bytes()
    rows = [{k: v for k, v in row.items() if k != "images/s"} for row in read_metrics(out / "metrics.jsonl")]
    return contents, rows


def test_a_time_limit_inside_the_warmup_is_said_with_the_steps_that_fit():
    # --steps 1000000 --max-time 2h at 0.36 s a step: the limit stops it at 7200 / 0.36 = 20,000 steps, inside a
    # warmup of 5% of a million steps (50,000), so the learning rate never reaches its value
    inside = expected_line(1_000_000, 0.36, 7200.0, warmup_steps=50_000)
    assert "stops it near step 20,000" in inside
    assert "still be in the learning-rate warmup (50,000 steps) there: ask for --steps near 20,000" in inside
    assert "warmup" not in expected_line(1_000_000, 0.36, 7200.0, warmup_steps=10_000)  # leaves it at step 10,000
    assert "warmup" not in expected_line(10_000, 0.36, 7200.0, warmup_steps=500)  # the run ends before the limit


def test_the_progress_line_says_so_too_from_the_measured_rate():
    from types import SimpleNamespace

    from gan_accel.callbacks.progress import estimate

    trainer = SimpleNamespace(config=TrainConfig(max_steps=1_000_000, max_time=7200.0, warmup_ratio=0.05),
                              accelerator=SimpleNamespace(num_processes=1), step=100, images_per_step=64)
    slow = estimate(trainer, steps_per_second=2.0, time_left=7000.0)  # stops near 100 + 14,000 = 14,100
    assert "stops it near step 14,100" in slow and "warmup (50,000 steps)" in slow and "--steps near 14,100" in slow
    fast = estimate(trainer, steps_per_second=10.0, time_left=7000.0)  # near 70,100: past the warmup
    assert "stops it near step 70,100" in fast and "warmup" not in fast
