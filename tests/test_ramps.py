"""Ramps: settings scheduled in training images seen, the same under accumulation, on N processes and on resume."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import TableLatents, assert_close_dicts, make_images, make_models, params, reset_accelerate_state
from gan_accel import Callback, ConfigError, Ramp, TrainConfig
from gan_accel.engine.schedules import StepRamps, lambda_scheduler, warmup_then_decay
from test_rpgan import make_trainer

LR, BETA2, GAMMA = Ramp(2e-2, 5e-3, 40), Ramp(0.9, 0.99, 32, "linear"), Ramp(4.0, 0.5, 24)


# -- the value -------------------------------------------------------------------------------------
def test_the_value_against_a_hand_computation_for_both_shapes():
    cosine, linear = Ramp(1.0, 3.0, 100), Ramp(1.0, 3.0, 100, "linear")
    assert cosine(0) == linear(0) == 1.0
    assert cosine(25) == pytest.approx(1.0 + 2.0 * (1 - math.cos(math.pi / 4)) / 2, abs=1e-15)
    assert cosine(50) == pytest.approx(2.0, abs=1e-15) and linear(25) == pytest.approx(1.5, abs=1e-15)
    assert cosine(100) == linear(100) == cosine(10**9) == linear(101) == 3.0  # clamped at end after `images`
    assert Ramp(0.1, 0.3, 7)(7) == 0.3  # exactly end, not 0.1 + (0.3 - 0.1) * 1.0 = 0.30000000000000004


@pytest.mark.parametrize("bad, message", [
    (lambda: Ramp(1.0, 2.0, 0), "Ramp images=0 is invalid"),
    (lambda: Ramp(1.0, float("nan"), 10), "Ramp end=nan is invalid: expected a finite number"),
    (lambda: Ramp(1.0, 2.0, 10, "step"), "Ramp shape='step' is invalid: choose cosine or linear"),
    (lambda: TrainConfig(lr_G=Ramp(1e-3, -1e-3, 10)), "lr_G.end=-0.001 is invalid: expected a finite number > 0"),
    (lambda: TrainConfig(betas_D=(0.5, Ramp(0.9, 1.0, 10))), "betas_D=(0.5, Ramp("),
    (lambda: TrainConfig(augment="diffaugment", augment_p=Ramp(0.0, 1.5, 10)), "augment_p.end=1.5 is invalid"),
    (lambda: TrainConfig(augment="ada", augment_p=Ramp(0.0, 0.5, 10)), "augment='ada' steers p itself"),
    (lambda: TrainConfig(clip_grad_norm_G=Ramp(1.0, 2.0, 10)), "clip_grad_norm_G=Ramp(start=1.0"),
])
def test_bad_ramps_are_one_line_config_errors(bad, message):
    with pytest.raises(ConfigError) as caught:
        bad()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_rate_ramp_with_a_scheduler_of_yours_is_refused_in_one_line(tmp_path):
    from gan_accel import GANTrainer, PreflightError
    from conftest import make_loader

    G, D = make_models(0)
    optimizer = torch.optim.Adam(D.parameters())
    config = TrainConfig(batch_size=4, z_dim=4, lr_D=LR, output_dir=str(tmp_path / "run"), progress_bar=False)
    with pytest.raises(PreflightError, match=r"^lr_D is a Ramp, .*pass lr_multiplier_D instead of sched_D"):
        GANTrainer(G, D, make_loader(make_images(16), 4), config, latent_sampler=TableLatents(4096),
                   sched_D=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))


def test_config_json_round_trip(tmp_path):
    config = TrainConfig(lr_G=LR, betas_D=(0.5, BETA2), r1_gamma=GAMMA, r2_gamma=Ramp(1.0, 2.0, 5, "linear"),
                         ema_half_life=Ramp(10.0, 500.0, 1000), augment="diffaugment", augment_p=Ramp(0.0, 0.6, 99))
    config.to_json(tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["lr_G"] == {"start": 2e-2, "end": 5e-3, "images": 40, "shape": "cosine"}
    assert saved["betas_D"] == [0.5, {"start": 0.9, "end": 0.99, "images": 32, "shape": "linear"}]
    assert TrainConfig.from_dict(saved) == config
    assert TrainConfig.from_dict(TrainConfig().to_dict()) == TrainConfig()  # plain numbers stay numbers


# -- the same values per step, whatever the batch is made of ----------------------------------------
class Recorder(Callback):
    """Per step: the rates and beta2 each update used, gamma at the images the penalties read, the EMA's decay
    and diffaugment's p."""

    def __init__(self):
        self.rows = []

    def on_phase_end(self, trainer, phase):
        if phase.name == "G":
            runner, config = trainer.runner, trainer.config
            self.rows.append((runner.lr_used["lr/D"], runner.lr_used["lr/G"], trainer.opt_D.param_groups[0]["betas"],
                              trainer.opt_G.param_groups[0]["betas"], config.r1_gamma(runner.ctx.images),
                              trainer.ema.current_decay(trainer.images_per_step), runner.augmentation.augment.p))


RAMPS = dict(lr_G=LR, lr_D=Ramp(1e-2, 3e-2, 48, "linear"), betas_G=(0.5, BETA2), betas_D=(Ramp(0.5, 0.0, 30), 0.99),
             r1_gamma=GAMMA, ema_half_life=Ramp(8.0, 64.0, 40), augment="diffaugment", augment_p=Ramp(0.2, 0.9, 40),
             warmup_ratio=0.25)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")  # ticked without updates below
def test_the_values_per_step_are_the_same_for_accumulation_a_larger_batch_and_two_processes(tmp_path):
    steps, images = 6, make_images(96)
    recorded = []
    for name, batch, accum in (("accum", 8, 2), ("big", 16, 1)):
        recorder = Recorder()
        trainer = make_trainer(tmp_path / name, images, batch, steps, grad_accum_steps=accum, **RAMPS)
        trainer.callbacks.add(recorder)
        trainer.fit()
        recorded.append(recorder.rows)
    assert recorded[0] == recorded[1] and len(recorded[0]) == steps
    lr_D, lr_G, betas_D, betas_G, gamma, decay, p = zip(*recorded[0])
    curve = warmup_then_decay(steps, int(0.25 * steps))  # the warmup/decay multiplier applies on top
    seen = [16 * k for k in range(steps)]  # images before each step: 8 x 2 or 16 x 1
    assert list(lr_G) == [LR(n) * curve(k) for k, n in enumerate(seen)]
    assert list(lr_D) == [RAMPS["lr_D"](n) * curve(k) for k, n in enumerate(seen)]
    assert list(betas_G) == [(0.5, BETA2(n)) for n in seen]
    assert list(betas_D) == [(RAMPS["betas_D"][0](n), 0.99) for n in seen]
    assert list(gamma) == [GAMMA(n) for n in seen]
    assert list(decay) == [0.5 ** (16 / RAMPS["ema_half_life"](n)) for n in seen]
    assert list(p) == [RAMPS["augment_p"](n) for n in seen] and len(set(p)) > 3
    # two processes of 8 without accumulation: 16 images a step, and the same rates and betas at every step, with
    # the scheduler ticked twice per update as Accelerate does on 2 processes
    G, D = make_models(0)
    optimizers = {name: torch.optim.Adam(net.parameters(), lr=1.0) for name, net in (("G", G), ("D", D))}
    schedulers = {name: lambda_scheduler(opt, curve, 2) for name, opt in optimizers.items()}
    ramps = StepRamps(TrainConfig(batch_size=8, **RAMPS), 2, optimizers, schedulers, ["G", "D"])
    for k in range(steps):
        assert ramps.apply(k) == seen[k]
        assert [optimizers[n].param_groups[0]["lr"] for n in "DG"] == [lr_D[k], lr_G[k]]
        assert [optimizers[n].param_groups[0]["betas"] for n in "DG"] == [betas_D[k], betas_G[k]]
        for scheduler in schedulers.values():
            scheduler.step(), scheduler.step()
    assert StepRamps(TrainConfig(batch_size=8, **RAMPS), 1, {}, {}, []).apply(3) == 24  # one process: half as many


# -- a plain PyTorch twin with the same per-step values ----------------------------------------------
def ramped_rpgan_loop(images, batch, steps, lr, beta2, gamma, warmup=0.4):
    """R3GAN's step by hand (RpGAN + R1 + R2 in D's step, then G), with this step's lr, beta2 and gamma set from
    the images seen before it."""
    G, D = make_models(0)
    latents = TableLatents(4096)
    opt_G = torch.optim.Adam(G.parameters(), lr=lr.start, betas=(0.5, beta2.start), fused=True)
    opt_D = torch.optim.Adam(D.parameters(), lr=lr.start, betas=(0.5, beta2.start), fused=True)
    curve = warmup_then_decay(steps, int(warmup * steps), "linear")
    for step in range(steps):
        seen = step * batch
        for group in opt_G.param_groups + opt_D.param_groups:
            group["lr"], group["betas"] = lr(seen) * curve(step), (0.5, beta2(seen))
        real = images[step * batch:(step + 1) * batch]
        fake = G(latents(batch, torch.device("cpu")))
        x_real, x_fake = real.detach().requires_grad_(True), fake.detach().requires_grad_(True)
        d_real, d_fake = D(x_real), D(x_fake)
        (g_real,) = torch.autograd.grad(d_real.sum(), x_real, create_graph=True)
        (g_fake,) = torch.autograd.grad(d_fake.sum(), x_fake, create_graph=True)
        loss = F.softplus(-(d_real - d_fake)).mean() + gamma(seen) / 2 * g_real.pow(2).flatten(1).sum(1).mean() \
            + gamma(seen) / 2 * g_fake.pow(2).flatten(1).sum(1).mean()
        loss.backward()
        opt_D.step()
        opt_D.zero_grad()
        D.requires_grad_(False)
        F.softplus(-(D(fake) - D(real))).mean().backward()
        D.requires_grad_(True)
        opt_G.step()
        opt_G.zero_grad()
    return params(G), params(D)


def test_engine_with_ramps_matches_a_plain_pytorch_loop(tmp_path):
    steps, b = 5, 8
    images = make_images(steps * b)
    trainer = make_trainer(tmp_path / "run", images, b, steps, lr_G=LR, lr_D=LR, betas_G=(0.5, BETA2),
                           betas_D=(0.5, BETA2), r1_gamma=GAMMA, r2_gamma=GAMMA)
    trainer.fit()
    twin_G, twin_D = ramped_rpgan_loop(images, b, steps, LR, BETA2, GAMMA)
    assert_close_dicts(params(trainer.G), twin_G, atol=1e-12)
    assert_close_dicts(params(trainer.D), twin_D, atol=1e-12)
    # the ramps moved the networks: the twin held at the ramps' start values ends elsewhere
    held = [Ramp(r.start, r.start, 1) for r in (LR, BETA2, GAMMA)]
    _, held_D = ramped_rpgan_loop(images, b, steps, *held)
    assert max((held_D[k] - twin_D[k]).abs().max() for k in twin_D) > 1e-4


# -- resume mid-ramp --------------------------------------------------------------------------------
def test_resume_mid_ramp_is_bitwise_identical(tmp_path):
    from test_resume import STOP_AT, _interrupted, _resumed, _straight, check_runs

    ramps = dict(lr_G=Ramp(2e-3, 2e-4, 48), lr_D=Ramp(1e-3, 4e-3, 40, "linear"), betas_G=(0.5, Ramp(0.9, 0.99, 56)),
                 r1_gamma=Ramp(2.0, 0.2, 48), r1_every=2, ema_decay=None, ema_half_life=Ramp(8.0, 40.0, 64),
                 augment="diffaugment", augment_p=Ramp(0.1, 0.8, 40))
    _straight(str(tmp_path), **ramps)
    reset_accelerate_state()
    _interrupted(str(tmp_path), **ramps)
    assert os.path.isdir(tmp_path / "resumed" / "checkpoints" / f"checkpoint_{STOP_AT:08d}")
    reset_accelerate_state()
    _resumed(str(tmp_path), **ramps)
    check_runs(tmp_path, ranks=[0])  # weights, optimizer states (rates and betas), EMA, metric rows, samples
