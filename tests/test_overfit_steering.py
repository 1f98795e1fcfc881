"""ADA's p steered by D's held-out gap (OverfitSteering): p rises only while D memorises its training images,
each move is the one the logged measurement asks for, a resumed run steers exactly as an uninterrupted one,
and a mis-set run is refused in one line."""

from __future__ import annotations

import pytest
import torch

from conftest import reset_accelerate_state
from gan_accel import GANTrainer, TrainConfig
from gan_accel.callbacks import OverfitSteering
from gan_accel.errors import ConfigError
from test_health import PerfectG, WideD, run, structured_images

TRAIN = structured_images(24, seed=1)  # 3 batches of 8: each image seen every 3 steps
HELD_OUT = structured_images(16, seed=2)  # other images of the same distribution
STEERED = dict(augment="ada", ada_signal="heldout", ada_target=0.3, ada_interval=10, ada_kimg=1.0,
               lr_D=3e-3, warmup_ratio=0.0, sample_every=30, log_every=10)


def steered_run(tmp_path, name="run", held_out=HELD_OUT, **overrides):
    torch.manual_seed(0)  # the same initial D in every run of a test
    return run(tmp_path, name, G=PerfectG(), D=WideD(), images=TRAIN,
               callbacks=[OverfitSteering(held_out, min_interval=10)], **{**STEERED, "max_steps": 200, **overrides})


def replay(overfits: list[float], target: float, step: float, p_max: float = 0.99) -> list[float]:
    """p after each measurement, computed here from the logged measurements: ADA's rule on the held-out gap."""
    p, out = 0.0, []
    for value in overfits:
        p = min(max(p + ((value > target) - (value < target)) * step, 0.0), p_max)
        out.append(p)
    return out


def test_p_rises_while_d_memorises_and_each_move_follows_the_logged_gap(tmp_path):
    trainer, rows = steered_run(tmp_path)
    measured = [r for r in rows if "augment/overfit" in r]
    assert [r["step"] for r in measured] == list(range(10, 201, 10))  # every 10 steps, in that step's row
    step = 10 * 8 / 1000  # interval x images per step / (ada_kimg x 1000)
    expected = replay([r["augment/overfit"] for r in measured], 0.3, step)
    assert [r["augment/p"] for r in measured] == pytest.approx(expected, abs=1e-12)
    assert max(r["augment/overfit"] for r in measured) > 0.3 and expected[-1] > 0  # D memorised: p rose
    assert trainer.runner.augmentation.augment.p == pytest.approx(expected[-1])


def test_held_out_images_that_are_the_training_images_keep_p_at_zero(tmp_path):
    _, rows = steered_run(tmp_path, held_out=TRAIN)
    measured = [r for r in rows if "augment/overfit" in r]
    assert len(measured) == 20 and all(abs(r["augment/overfit"]) < 0.2 for r in measured)
    assert all(r["augment/p"] == 0.0 for r in measured)


def test_a_resumed_run_steers_exactly_as_an_uninterrupted_one(tmp_path):
    straight, straight_rows = steered_run(tmp_path, "straight", checkpoint_every=50)
    reset_accelerate_state()
    steered_run(tmp_path, "resumed", checkpoint_every=50, stop_at_step=100)
    reset_accelerate_state()
    resumed, resumed_rows = steered_run(tmp_path, "resumed", checkpoint_every=50, resume=True)
    assert resumed.runner.augmentation.augment.p == straight.runner.augmentation.augment.p
    for a, b in zip(straight.D.state_dict().values(), resumed.D.state_dict().values()):
        assert torch.equal(a, b)
    keys = ("step", "augment/p", "augment/overfit")
    assert [{k: r.get(k) for k in keys} for r in resumed_rows] == [{k: r.get(k) for k in keys} for r in straight_rows]


def test_the_engine_leaves_p_to_the_callback(tmp_path):
    """With ada_signal="heldout" the engine's own ADA controller is off: without the callback p stays put."""
    trainer, rows = run(tmp_path, G=PerfectG(), D=WideD(), images=TRAIN, **{**STEERED, "max_steps": 60})
    assert trainer.runner.augmentation.controller is None
    assert {r["augment/p"] for r in rows if "augment/p" in r} == {0.0}


def test_a_mis_set_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="set augment='ada' and ada_signal='heldout'"):
        run(tmp_path, G=PerfectG(), D=WideD(), images=TRAIN, callbacks=[OverfitSteering(HELD_OUT)],
            augment="ada", max_steps=4)
    with pytest.raises(ConfigError, match="ada_signal='nope' is invalid: choose one of rt, heldout"):
        TrainConfig(augment="ada", ada_signal="nope").validate()
    with pytest.raises(ConfigError, match="at least 2 held-out real images"):
        OverfitSteering(HELD_OUT[:1])
    assert GANTrainer  # the public API steers through the callback named in gan_accel.callbacks
