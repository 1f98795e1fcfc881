"""LeCam regularisation (Tseng et al. 2021): the penalty and the anchors' moving averages, each against a hand
computation; the flag's refusals. Accumulation, two processes and resume are proven with the other runs
(test_engine.py, test_distributed.py, test_resume.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cli_runs import error_line
from conftest import TableLatents, make_images, make_loader, make_models
from gan_accel import Callback, ConfigError, GANTrainer, PhaseError, TrainConfig, discriminator_loss
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.config import compare_configs
from gan_accel.objectives.losses import LOSSES
from gan_accel.objectives.regularizers import LECAM_DECAY, LeCamAnchors
from test_phases import TanhD, context_for


def test_the_penalty_matches_the_hand_computation_with_known_anchors():
    """loss + w * (mean (D(x) - alpha_F)^2 + mean (D(G(z)) - alpha_R)^2); the anchors get no gradient."""
    real, fake = make_images(6, seed=1), make_images(6, seed=2)
    D, twin = TanhD(16), TanhD(16)
    ctx = context_for(D, real, fake)
    ctx.lecam = LeCamAnchors()
    ctx.lecam.anchors = torch.tensor([0.7, -1.3], dtype=torch.float64)  # alpha_R, alpha_F
    value = discriminator_loss(LOSSES["hinge"], lecam_weight=0.25)(ctx)
    expected = (F.relu(1 - twin(real)).mean() + F.relu(1 + twin(fake)).mean()
                + 0.25 * (((twin(real) + 1.3) ** 2).mean() + ((twin(fake) - 0.7) ** 2).mean()))
    torch.testing.assert_close(value, expected, atol=1e-12, rtol=0)
    value.backward()
    expected.backward()
    for p, q in zip(D.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-12, rtol=0)
    assert not ctx.lecam.anchors.requires_grad
    # the loss observed its logits for the step's update: (sum real, sum fake, count real, count fake)
    with torch.no_grad():
        torch.testing.assert_close(ctx.lecam._sums, torch.stack([twin(real).sum(), twin(fake).sum(),
                                                                 torch.tensor(6.0).double(), torch.tensor(6.0).double()]))


def test_the_penalty_without_the_runs_anchors_is_refused_in_one_line():
    ctx = context_for(TanhD(16), make_images(2), make_images(2, seed=2))
    with pytest.raises(PhaseError, match="set TrainConfig.lecam_weight"):
        discriminator_loss(LOSSES["nonsaturating"], lecam_weight=1.0)(ctx)


def test_the_anchors_follow_the_moving_average_of_every_process_means():
    """One update per step from the whole step (every micro-batch, every process); a NaN logit counts as nothing;
    a step without logits leaves the anchors; the state round-trips exactly."""
    other_process = torch.tensor([10.0, -20.0, 2.0, 4.0], dtype=torch.float64)  # sums and counts of a second rank
    reduced = []
    anchors = LeCamAnchors(reduce=lambda t: reduced.append(t.clone()) or t + other_process)
    expected = [0.0, 0.0]
    steps = [[([1.0, 2.0], [-1.0, float("nan")]), ([3.0], [-2.0, -4.0])],  # two micro-batches, one NaN
             [([0.5, -0.5, 4.0], [1.0, 1.0, 1.0])]]
    for step in steps:
        for real, fake in step:
            anchors.observe(torch.tensor(real, dtype=torch.float32), torch.tensor(fake, dtype=torch.float32))
        finite_fake = [f for _, fake in step for f in fake if f == f]
        real_sum, fake_sum = sum(r for real, _ in step for r in real), sum(finite_fake)
        real_count = sum(len(real) for real, _ in step)
        means = ((real_sum + 10.0) / (real_count + 2), (fake_sum - 20.0) / (len(finite_fake) + 4))
        expected = [LECAM_DECAY * a + (1 - LECAM_DECAY) * m for a, m in zip(expected, means)]
        anchors.update()
        assert anchors.anchors.tolist() == pytest.approx(expected, abs=1e-15, rel=0)
    assert len(reduced) == 2 and reduced[0].tolist() == [6.0, -7.0, 3.0, 3.0]  # one collective per step
    before = anchors.anchors.clone()
    idle = LeCamAnchors()
    idle.anchors = before.clone()
    idle.update()  # no logits this step, on any process
    assert torch.equal(idle.anchors, before)
    restored = LeCamAnchors()
    restored.load_state_dict(anchors.state_dict())
    assert torch.equal(restored.anchors, anchors.anchors) and restored.anchors.dtype == torch.float64


class Recorder(Callback):
    """The anchors after every step, from the run's own LeCamAnchors."""

    def __init__(self):
        self.after_step = []

    def on_step_end(self, trainer):
        self.after_step.append(trainer.runner.lecam.anchors.tolist())


def test_in_training_the_penalty_reads_the_step_start_anchors_and_each_step_moves_them_once(tmp_path):
    """n_critic 2 and accumulation 2: four D forwards per step; every penalty of a step sees the anchors the step
    started with, and the anchors then move once, by the mean logits of all four micro-batches."""
    config = TrainConfig(max_steps=3, batch_size=4, grad_accum_steps=2, n_critic=2, z_dim=4, lecam_weight=0.5,
                         log_every=1, sample_every=1000, num_samples=4, output_dir=str(tmp_path / "run"),
                         progress_bar=False, warmup_ratio=0.0, lr_G=1e-2, lr_D=1e-2)
    G, D = make_models(0)
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), config, latent_sampler=latents)
    latents.rewind()
    lecam, seen = trainer.runner.lecam, []  # (anchors the penalty read, real logits, fake logits), per call
    observe = lecam.observe
    lecam.observe = lambda r, f: (seen.append([lecam.anchors.tolist(), r.detach(), f.detach()]), observe(r, f))[1]
    recorder = Recorder()
    trainer.callbacks.add(recorder)
    trainer.fit()
    assert len(seen) == 3 * 2 * 2
    anchors = [0.0, 0.0]
    for step in range(3):
        calls = seen[4 * step: 4 * step + 4]
        assert all(used == calls[0][0] for used, _, _ in calls), "a penalty read anchors moved within its step"
        assert calls[0][0] == pytest.approx(anchors, abs=1e-14, rel=0), "the step started from other anchors"
        means = [torch.cat([c[i] for c in calls]).mean().item() for i in (1, 2)]
        anchors = [LECAM_DECAY * a + (1 - LECAM_DECAY) * m for a, m in zip(anchors, means)]
        assert recorder.after_step[step] == pytest.approx(anchors, abs=1e-14, rel=0)
        assert anchors[0] != 0.0 and anchors[1] != 0.0
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["lecam/alpha_R"], r["lecam/alpha_F"]) for r in rows] == [tuple(a) for a in recorder.after_step]
    assert all(r["penalty/LeCam"] > 0 for r in rows)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "abc"])
def test_the_config_refuses_a_weight_that_is_not_a_finite_positive_number(value):
    with pytest.raises(ConfigError, match=r"lecam_weight=.* is invalid: expected a finite number > 0"):
        TrainConfig(lecam_weight=value)


def test_a_resume_may_change_the_weight_but_not_switch_lecam_on_or_off():
    off, on, stronger = (TrainConfig(lecam_weight=w).to_dict() for w in (None, 0.3, 0.6))
    assert compare_configs(on, stronger) == ([], {"lecam_weight": [0.3, 0.6]})
    assert compare_configs(off, on)[0] == ["lecam_weight: None -> 0.3"]
    assert compare_configs(on, off)[0] == ["lecam_weight: 0.3 -> None"]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "abc"])
def test_the_flag_refuses_a_bad_weight_in_one_line(capsys, tmp_path, value):
    line = error_line(["train", "--data", str(tmp_path), "--lecam", value], capsys)
    assert line == f"error: argument --lecam: '{value}' is not a number > 0 (see gan-accel train --help)"
