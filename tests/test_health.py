"""Training health: gradient norms, D's outputs, the fp16 loss scale and diversity in the metrics rows,
and the health warnings, each shown on a run built to fail that way (and absent from a healthy one)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from conftest import (IMAGE_SHAPE, NUM_CLASSES, Z_DIM, make_images, make_labels, make_loader, make_models,
                      reset_accelerate_state)

IMAGE_NUMEL = math.prod(IMAGE_SHAPE)
from gan_accel import GANTrainer, TrainConfig, default_phases
from gan_accel.callbacks import HealthMonitor, ProgressBar
from gan_accel.callbacks.d_probe import OVERFIT_MIN_GAP, probe_statistics
from gan_accel.callbacks.health import mean_pairwise_distance
from gan_accel.callbacks.metrics_log import read_metrics

WARNING = "gan_accel: warning:"


def run(tmp_path, name="run", G=None, images=None, phases=None, accelerator=None, stop_at_step=None,
        resume=False, D=None, callbacks=(), disable=(), images_labels=None, **overrides):
    """A tiny float32 run (4x4 images, MLP G and D); returns (trainer, metrics rows)."""
    settings = dict(max_steps=40, batch_size=8, z_dim=Z_DIM, log_every=2, sample_every=4, checkpoint_every=1000,
                    num_samples=16, output_dir=str(tmp_path / name), progress_bar=False)
    config = TrainConfig(**{**settings, **overrides})
    g, d = make_models(dtype=torch.float32)
    images = make_images(256, dtype=torch.float32) if images is None else images
    trainer = GANTrainer(G or g, D or d, make_loader(images, 8, images_labels), config, accelerator=accelerator,
                         phases=phases(config) if phases else None, callbacks=callbacks,
                         disable_callbacks=disable)
    trainer.fit(resume_from="latest" if resume else None, stop_at_step=stop_at_step)
    return trainer, read_metrics(tmp_path / name / "metrics.jsonl")


def warnings_about(out: str, what: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(WARNING) and what in line]


# -- the constructed failures ---------------------------------------------------------------------
EASY_DATA = make_images(256, dtype=torch.float32) * 0.1 + 0.8  # near-constant bright images: easy to tell apart
D_WINS = dict(images=EASY_DATA, lr_D=0.05, lr_G=1e-8)  # a fast D against a G that cannot move


class ConstantG(nn.Module):
    """Ignores its latents: every sample is the same image."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Parameter(torch.zeros(*IMAGE_SHAPE))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.image).expand(z.shape[0], *IMAGE_SHAPE) + 0 * z.sum()


def collapsing(config):
    """G trained to shrink the spread of its samples: its diversity falls step by step."""
    d_phase, g_phase = default_phases(config)
    return [d_phase, dataclasses.replace(g_phase, loss=lambda ctx: 10 * ctx.fake.var(0).sum())]


def exploding(config):
    """G's logged loss jumps by 50 from step 20 on (its gradients are unchanged)."""
    d_phase, g_phase = default_phases(config)
    return [d_phase, dataclasses.replace(g_phase, loss=lambda ctx: g_phase.loss(ctx) + (50.0 if ctx.step >= 20 else 0.0))]


def nan_at_step(step):
    def phases(config):
        d_phase, g_phase = default_phases(config)
        nan = lambda ctx: g_phase.loss(ctx) * (math.nan if ctx.step == step else 1.0)  # noqa: E731
        return [d_phase, dataclasses.replace(g_phase, loss=nan)]
    return phases


# -- the metrics ------------------------------------------------------------------------------------
def test_a_healthy_run_logs_grad_norms_lrs_d_outputs_and_diversity_and_warns_nothing(tmp_path, capsys):
    trainer, rows = run(tmp_path)
    for row in rows:
        for key in ("grad_norm/G", "grad_norm/D", "lr/G", "lr/D", "D(x)", "D(G(z))"):
            assert math.isfinite(row[key]), (row["step"], key)
        assert row["grad_norm/G"] > 0 and row["grad_norm/D"] > 0
        assert "loss_scale" not in row  # no fp16 GradScaler here
    # Diversity: measured at each sample step (4, 8, ...), before that step's row, so it lands in it.
    assert [r["step"] for r in rows if "health/diversity" in r] == list(range(4, 41, 4))
    assert all(r["health/diversity"] > 0.1 for r in rows if "health/diversity" in r)
    assert trainer.callbacks.get("health_monitor").warnings == []
    assert WARNING not in capsys.readouterr().out


def test_the_progress_bar_shows_d_outputs():
    shown = {}
    bar = ProgressBar()
    bar.bar = SimpleNamespace(set_postfix=shown.update)
    bar.on_log(None, {"loss/D": 1.0, "loss/G": 2.0, "D(x)": 0.5, "D(G(z))": -0.25, "images/s": 10.0, "step": 2})
    assert shown == {"loss/D": "1", "loss/G": "2", "D(x)": "0.5", "D(G(z))": "-0.25", "images/s": "10"}


def test_grad_norm_is_the_total_norm_of_the_last_step_of_each_log_interval(tmp_path):
    # Clipping at a norm never reached logs the norm of every update without changing any gradient:
    # the reference. Without clipping, the norm is taken on the log interval's last step only.
    no_clip = dict(max_steps=9, sample_every=100)
    _, every_step = run(tmp_path, "clipped", log_every=1, clip_grad_norm_G=1e9, clip_grad_norm_D=1e9, **no_clip)
    reset_accelerate_state()
    _, each_row = run(tmp_path, "plain_1", log_every=1, **no_clip)
    reset_accelerate_state()
    _, every_third = run(tmp_path, "plain_3", log_every=3, **no_clip)
    norms = lambda rows: [(r["step"], r["grad_norm/G"], r["grad_norm/D"]) for r in rows]  # noqa: E731
    assert norms(each_row) == norms(every_step)
    assert norms(every_third) == [n for n in norms(every_step) if n[0] % 3 == 0]


def test_under_fp16_loss_scaling_the_grad_norm_is_unscaled_and_the_scale_is_logged(tmp_path):
    # A real GradScaler on the CPU: accelerator.backward scales the loss, the prepared optimizers unscale.
    _, plain = run(tmp_path, "plain", max_steps=6, sample_every=100)
    reset_accelerate_state()
    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    _, scaled = run(tmp_path, "scaled", accelerator=accelerator, max_steps=6, sample_every=100)
    assert [r["loss_scale"] for r in scaled] == [1024.0] * 3
    for a, b in zip(plain, scaled):
        assert b["grad_norm/G"] == pytest.approx(a["grad_norm/G"], rel=1e-6)
        assert b["grad_norm/D"] == pytest.approx(a["grad_norm/D"], rel=1e-6)


def test_a_skipped_update_leaves_the_grad_norm_of_the_kept_ones(tmp_path):
    calls = []

    def phases(config):
        d_phase, _, g_phase = default_phases(config)  # D, D, G

        def d_loss(ctx):  # D's 6th update (the 2nd D phase of step 2, a log step) has a NaN loss
            calls.append(ctx.step)
            return d_phase.loss(ctx) * (math.nan if len(calls) == 6 else 1.0)

        return [dataclasses.replace(d_phase, loss=d_loss), dataclasses.replace(d_phase, loss=d_loss), g_phase]

    _, rows = run(tmp_path, phases=phases, n_critic=2, max_steps=4, log_every=1, sample_every=100)
    assert calls[5] == 2 and math.isnan(rows[2]["loss/D"])  # the NaN was seen, and the update skipped
    assert rows[2]["skipped/D"] == 1
    assert all(math.isfinite(r["grad_norm/D"]) and r["grad_norm/D"] > 0 for r in rows)


# -- the warnings -------------------------------------------------------------------------------------
def test_d_winning_outright_warns_once(tmp_path, capsys):
    _, rows = run(tmp_path, **D_WINS)
    assert rows[-1]["loss/D"] < 0.01 and rows[-1]["D(x)"] - rows[-1]["D(G(z))"] > 10
    lines = warnings_about(capsys.readouterr().out, "D is winning outright")
    assert len(lines) == 1, lines
    assert "loss/D has stayed below 0.0693 (0.05 x its chance level 1.39)" in lines[0]
    assert "Try a lower lr_D" in lines[0]


def test_an_exploding_g_loss_warns_once_and_d_is_not_blamed(tmp_path, capsys):
    run(tmp_path, phases=exploding)
    out = capsys.readouterr().out
    lines = warnings_about(out, "G's loss is exploding")
    assert len(lines) == 1 and "at step 26" in lines[0], lines  # rows 22, 24, 26 are above the limit
    assert "above 3.8 (its early median 0.799 + 3 x max(|median|, 1))" in lines[0]
    assert not warnings_about(out, "D is winning") and not warnings_about(out, "diversity")


def test_a_non_finite_g_loss_warns_at_once(tmp_path, capsys):
    run(tmp_path, phases=nan_at_step(5), max_steps=8, log_every=1)
    lines = warnings_about(capsys.readouterr().out, "G's loss is nan")
    assert len(lines) == 1 and "at step 6" in lines[0], lines


def test_a_generator_with_constant_output_warns_of_collapse_once_past_the_early_measurements(tmp_path, capsys):
    trainer, rows = run(tmp_path, G=ConstantG())
    assert all(r["health/diversity"] == 0 for r in rows if "health/diversity" in r)
    lines = warnings_about(capsys.readouterr().out, "sample diversity collapsed")
    assert len(lines) == 1, lines  # one episode: the samples never recover
    # measured every 4 steps; the floor applies from the 4th measurement (after early_samples=3)
    assert "at step 16" in lines[0] and "below 0.1 x the real data's 3.07" in lines[0]



class OneImagePerClassG(nn.Module):
    """A conditional G that ignores its latents: one image per class, different classes far apart."""

    def __init__(self) -> None:
        super().__init__()
        self.images = nn.Parameter(torch.linspace(-1, 1, NUM_CLASSES)[:, None].expand(NUM_CLASSES, IMAGE_NUMEL)
                                   .clone())

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.images[y].reshape(-1, *IMAGE_SHAPE) + 0 * z.sum()


def test_a_conditional_generator_that_ignores_its_latents_warns_of_collapse_within_its_classes(tmp_path, capsys):
    """Across classes its samples differ (the diversity of all of them together is large); within a class
    they are one image: the diversity is measured within each class of the fixed labels."""
    labels = make_labels(256)
    _, D = make_models(dtype=torch.float32, conditional=True)
    config = dict(num_classes=NUM_CLASSES, num_samples=16)
    trainer, rows = run(tmp_path, G=OneImagePerClassG(), D=D, images_labels=labels, **config)
    fixed = trainer.generate()
    assert mean_pairwise_distance(fixed) > 1, "the samples of all classes together are far apart"
    assert all(r["health/diversity"] == 0 for r in rows if "health/diversity" in r)
    lines = warnings_about(capsys.readouterr().out, "sample diversity collapsed")
    assert len(lines) == 1 and "apart on average within a class" in lines[0], lines
    reals, real_labels = trainer.reference_samples, trainer.reference_labels  # the floor: reals within a class
    expected = [float(torch.pdist(reals[real_labels == c].flatten(1)).mean()) for c in real_labels.unique().tolist()
                if int((real_labels == c).sum()) > 1]
    monitor = trainer.callbacks.get("health_monitor")
    assert monitor.real_diversity == pytest.approx(sum(expected) / len(expected), rel=1e-6)


def test_a_short_run_of_an_untrained_generator_does_not_warn_of_collapse(tmp_path, capsys):
    """At initialisation G maps every latent to nearly the same output: not a collapse to warn about."""
    trainer, rows = run(tmp_path, G=ConstantG(), max_steps=12)
    assert [step for step, _ in trainer.callbacks.get("health_monitor").diversity] == [4, 8, 12]
    assert warnings_about(capsys.readouterr().out, "sample diversity collapsed") == []


def test_a_generator_trained_to_collapse_warns_when_its_diversity_halves(tmp_path, capsys):
    trainer, rows = run(tmp_path, phases=collapsing, lr_G=0.01)
    measured = trainer.callbacks.get("health_monitor").diversity
    lines = warnings_about(capsys.readouterr().out, "sample diversity collapsed")
    assert len(lines) == 1, lines
    first_low = next(step for step, value in measured if value < 0.5 * max(v for _, v in measured[:3]))
    assert f"at step {first_low}" in lines[0] and "0.5 x its early peak" in lines[0]


def test_warnings_come_once_per_episode_and_again_after_a_recovery():
    printed = []
    trainer = SimpleNamespace(accelerator=SimpleNamespace(print=printed.append, is_main_process=False))
    monitor = HealthMonitor(patience=2)
    monitor.d_chance = 1.386
    for step, loss in enumerate([1.3, 0.01, 0.01, 0.01, 0.01, 1.2, 0.01, 0.01, 0.01]):
        monitor.on_log(trainer, {"step": step, "loss/D": loss})
    assert [line.split("at step ")[1].split(";")[0].split(")")[0] for line in printed] == ["2", "7"]
    # Wasserstein: the critic's loss has no floor (chance level 0), so the rule does not apply.
    critic, printed[:] = HealthMonitor(patience=1), []
    critic.d_chance = 0.0
    for step in range(5):
        critic.on_log(trainer, {"step": step, "loss/D": -5.0 * step})
    assert printed == []


def test_thresholds_are_checked_when_the_monitor_is_built():
    with pytest.raises(ValueError, match="patience=0 must be an integer >= 1"):
        HealthMonitor(patience=0)
    with pytest.raises(ValueError, match="diversity_drop=nan must be a finite number >= 0"):
        HealthMonitor(diversity_drop=math.nan)


def test_mean_pairwise_distance():
    points = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]])
    assert mean_pairwise_distance(points) == pytest.approx(10 / 3)
    assert math.isnan(mean_pairwise_distance(points[:1]))


def test_a_resumed_run_warns_and_logs_exactly_like_an_uninterrupted_one(tmp_path, capsys):
    # Stopped at step 15 mid-episode (rows 12 and 14 were below the limit, 16 warns) and with the
    # diversity measured at step 15 not yet in a row (it belongs to row 16).
    settings = dict(D_WINS, sample_every=3, checkpoint_every=1000, max_steps=24)
    straight, straight_rows = run(tmp_path, "straight", **settings)
    expected = capsys.readouterr().out
    reset_accelerate_state()
    run(tmp_path, "resumed", stop_at_step=15, **settings)
    reset_accelerate_state()
    _, resumed_rows = run(tmp_path, "resumed", resume=True, **settings)
    got = capsys.readouterr().out
    assert warnings_about(expected, "D is winning outright")  # the episode spans the stop
    assert warnings_about(got, WARNING) == warnings_about(expected, WARNING)
    for row in straight_rows + resumed_rows:
        row.pop("images/s")
    assert resumed_rows == straight_rows and "health/diversity" in resumed_rows[7]  # row 16


# -- D's probe ----------------------------------------------------------------------------------------
PROBE_KEYS = ("health/d_spread", "health/d_real", "health/d_fake", "health/rt")


class BiasOnlyD(nn.Module):
    """A dead D: its logit is a learned bias, the same whatever the image."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(x.shape[0]) + 0 * x.reshape(x.shape[0], -1).sum(1)


class WideD(nn.Module):
    """A D with room to memorise a few images."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(16, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128),
                                 nn.LeakyReLU(0.2), nn.Linear(128, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).reshape(x.shape[0])


MIXING = torch.randn(Z_DIM, 16, generator=torch.Generator().manual_seed(7))


class PerfectG(nn.Module):
    """Samples of the data's own distribution (images = z @ MIXING): only memorising the training images lets
    D tell them from G's samples. It never changes (its one parameter gets no gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mixing", MIXING.clone())
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (z @ self.mixing).reshape(z.shape[0], *IMAGE_SHAPE) + 0 * self.unused


def structured_images(n: int, seed: int) -> torch.Tensor:
    return (torch.randn(n, Z_DIM, generator=torch.Generator().manual_seed(seed)) @ MIXING).reshape(n, *IMAGE_SHAPE)


def by_hand(trainer, held_out=None):
    """D's logits on the probe images, computed here from the trained networks, and the values they give."""
    G, D = trainer.accelerator.unwrap_model(trainer.G), trainer.accelerator.unwrap_model(trainer.D)
    with torch.no_grad():
        real = D(trainer.reference_samples).double()
        fake = D(G(trainer.fixed_latents)).double()
        held = D(held_out).double() if held_out is not None else None
    both = torch.cat([real, fake])
    values = {"health/d_spread": both.std().item(), "health/d_real": real.mean().item(),
              "health/d_fake": fake.mean().item(),
              "health/rt": sum(float(r > f) + 0.5 * float(r == f) for r in real for f in fake) / (len(real) * len(fake))}
    if held is not None:
        values["health/d_heldout"] = held.mean().item()
        values["health/overfit"] = (real.mean() - held.mean()).item() / (real.mean() - fake.mean()).item()
    return values


def test_d_is_probed_at_every_sample_interval_and_the_values_are_ds_logits_on_the_probe_images(tmp_path, capsys):
    trainer, rows = run(tmp_path, max_steps=12)
    probed = [r for r in rows if "health/d_spread" in r]
    assert [r["step"] for r in probed] == [4, 8, 12]
    assert all("health/overfit" not in r and "health/d_heldout" not in r for r in rows)  # no held-out images
    expected = by_hand(trainer)
    assert {k: probed[-1][k] for k in expected} == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert len(trainer.reference_samples) == 8 and probed[-1]["health/d_spread"] > 0.05
    monitor = trainer.callbacks.get("health_monitor")
    assert monitor.d_probe == {"step": 12, **{k: probed[-1][k] for k in monitor.d_probe if k != "step"}}
    assert WARNING not in capsys.readouterr().out


def test_the_probe_leaves_the_run_as_it_was(tmp_path):
    """The same run with the probe switched off (the monitor disabled) trains to the same weights, bit for
    bit: the probe draws no random numbers and changes no buffer or mode of G and D."""
    trainer, _ = run(tmp_path, "probed", G=TrainModeG(seed=3), max_steps=12, sample_every=2)
    reset_accelerate_state()
    plain, _ = run(tmp_path, "plain", G=TrainModeG(seed=3), max_steps=12, sample_every=2,
                   disable=("health_monitor",))
    for a, b in zip(trainer.G.state_dict().values(), plain.G.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(trainer.D.state_dict().values(), plain.D.state_dict().values()):
        assert torch.equal(a, b)
    assert trainer.G.training and trainer.D.training


class TrainModeG(nn.Module):
    """A G with BatchNorm statistics and dropout: a probe in train mode must neither move the one nor draw
    the other's random numbers from the training RNG."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(Z_DIM, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.Linear(16, 16),
                                 nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).reshape(z.shape[0], *IMAGE_SHAPE)


def test_a_dead_d_warns_once_past_the_early_measurements(tmp_path, capsys):
    trainer, rows = run(tmp_path, D=BiasOnlyD())
    assert all(r["health/d_spread"] == 0 and r["health/rt"] == 0.5 for r in rows if "health/d_spread" in r)
    lines = warnings_about(capsys.readouterr().out, "D is dead")
    assert len(lines) == 1, lines
    # measured every 4 steps; the first 3 measurements are not judged; then 3 in a row: steps 16, 20, 24
    assert "at step 24" in lines[0] and "stayed below 0.05 for 3 measurements" in lines[0]
    assert "--augment ada or none" in lines[0] and "lower learning rate" in lines[0] and "R1/R2 gamma" in lines[0]
    monitor = trainer.callbacks.get("health_monitor")
    assert [(step, rule) for step, rule, _ in monitor.history] == [(24, "d_dead")]
    # gan-accel info RUN shows D's last probe and the warning, from health.json
    from gan_accel.cli.info import describe_run, format_report

    report = describe_run(tmp_path / "run")
    assert report["health"]["warnings"] == [{"step": 24, "rule": "d_dead", "line": lines[0]}]
    text = format_report(report).splitlines()
    assert "D's health (step 40; no held-out images: the overfitting check is off): d_spread 0, rt 0.5, " \
        f"d_real {rows[-1]['health/d_real']:.4g}, d_fake {rows[-1]['health/d_fake']:.4g}" in text
    assert "health warnings: 1" in text and f"  step 24: {lines[0]}" in text


def test_a_training_d_on_a_tiny_run_is_not_dead(tmp_path, capsys):
    _, rows = run(tmp_path, max_steps=60)
    spreads = [r["health/d_spread"] for r in rows if "health/d_spread" in r]
    assert len(spreads) == 15 and min(spreads[3:]) > 0.05
    assert warnings_about(capsys.readouterr().out, WARNING) == []


def test_a_d_that_memorises_its_training_images_warns_that_it_overfits(tmp_path, capsys):
    train = structured_images(24, seed=1)  # 3 batches of 8: each image seen every 3 steps
    held_out = structured_images(16, seed=2)  # other images of the same distribution
    monitor = HealthMonitor(held_out=held_out)
    trainer, rows = run(tmp_path, G=PerfectG(), D=WideD(), images=train, callbacks=[monitor], max_steps=300,
                        sample_every=30, log_every=30, lr_D=3e-3, warmup_ratio=0.0)
    last = rows[-1]
    expected = by_hand(trainer, held_out)
    assert {k: last[k] for k in expected} == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert last["health/overfit"] > 0.5
    lines = warnings_about(capsys.readouterr().out, "D is overfitting")
    assert len(lines) == 1, lines
    assert "--augment ada or diffaugment" in lines[0] and "larger R1/R2 gamma" in lines[0] and "more images" in lines[0]


def test_held_out_images_that_are_the_training_images_give_no_overfitting(tmp_path, capsys):
    train = structured_images(24, seed=1)
    monitor = HealthMonitor(held_out=train)
    trainer, rows = run(tmp_path, G=PerfectG(), D=WideD(), images=train, callbacks=[monitor], max_steps=300,
                        sample_every=30, log_every=30, lr_D=3e-3, warmup_ratio=0.0)
    overfits = [r["health/overfit"] for r in rows if "health/overfit" in r]
    assert len(overfits) >= 5 and max(abs(v) for v in overfits[3:]) < 0.2
    assert rows[-1]["health/overfit"] == pytest.approx(by_hand(trainer, train)["health/overfit"], rel=1e-5)
    assert warnings_about(capsys.readouterr().out, "overfitting") == []
    from gan_accel.cli.info import describe_run, format_report

    text = format_report(describe_run(tmp_path / "run"))
    assert f"D's health (step 300; 24 held-out images): d_spread {rows[-1]['health/d_spread']:.4g}, overfit " \
        f"{rows[-1]['health/overfit']:.4g}, rt {rows[-1]['health/rt']:.4g}" in text and "health warnings: none" in text


def test_probe_statistics_by_definition():
    real, fake, held = torch.tensor([2.0, 4.0]), torch.tensor([0.0, 4.0]), torch.tensor([1.0])
    values = probe_statistics(real, fake, held)
    assert values["health/d_spread"] == pytest.approx(torch.tensor([2.0, 4.0, 0.0, 4.0]).std().item())
    assert values["health/rt"] == pytest.approx((1 + 0 + 1 + 0.5) / 4)  # pairs (2,0) (2,4) (4,0) (4,4)
    assert values["health/overfit"] == pytest.approx((3 - 1) / (3 - 2))
    # D barely tells training reals from fakes: no ratio of noise to noise
    assert "health/overfit" not in probe_statistics(real, real - OVERFIT_MIN_GAP / 2, held)


def test_held_out_images_are_checked(tmp_path):
    with pytest.raises(ValueError, match="held_out must be a floating-point tensor"):
        HealthMonitor(held_out=torch.zeros(4, 1, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="held_out's labels must be an integer tensor"):
        HealthMonitor(held_out=(torch.zeros(4, 1, 4, 4), torch.zeros(3, dtype=torch.long)))
    with pytest.raises(ValueError, match=r"shaped \(1, 2, 2\) but the training samples \(1, 4, 4\)"):
        run(tmp_path, callbacks=[HealthMonitor(held_out=torch.zeros(4, 1, 2, 2))])
    with pytest.raises(ValueError, match="d_spread_floor=-1 must be a finite number >= 0"):
        HealthMonitor(d_spread_floor=-1)


def test_a_conditional_run_probes_d_with_the_labels(tmp_path):
    from conftest import NUM_CLASSES, make_labels

    images = make_images(64, dtype=torch.float32)
    labels = make_labels(64)
    G, D = make_models(dtype=torch.float32, conditional=True)
    config = TrainConfig(max_steps=8, batch_size=8, z_dim=Z_DIM, log_every=4, sample_every=4, num_samples=6,
                         num_classes=NUM_CLASSES, output_dir=str(tmp_path / "cond"), progress_bar=False)
    held = (make_images(10, seed=5, dtype=torch.float32), make_labels(10, seed=6))
    trainer = GANTrainer(G, D, make_loader(images, 8, labels), config, callbacks=[HealthMonitor(held_out=held)])
    trainer.fit()
    row = read_metrics(tmp_path / "cond" / "metrics.jsonl")[-1]
    with torch.no_grad():
        real = D(trainer.reference_samples, trainer.reference_labels)
        fake = D(G(trainer.fixed_latents, trainer.fixed_labels), trainer.fixed_labels)
        held_logits = D(*held)
    assert torch.equal(trainer.reference_labels, labels[:8])
    assert row["health/d_real"] == pytest.approx(real.mean().item(), rel=1e-5)
    assert row["health/d_fake"] == pytest.approx(fake.mean().item(), rel=1e-5)
    assert row["health/d_heldout"] == pytest.approx(held_logits.mean().item(), rel=1e-5)
    with pytest.raises(ValueError, match=r"HealthMonitor\(held_out=\(images, labels\)\)"):
        reset_accelerate_state()
        GANTrainer(G, D, make_loader(images, 8, labels), config, callbacks=[HealthMonitor(held_out=held[0])])
