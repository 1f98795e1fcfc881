"""The step as data: regularisers checked by hand, and every engine proof for runs with extra phases."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import (IMAGE_SHAPE, Z_DIM, TableEpsilon, TableLatents, assert_close_dicts, make_images, make_loader,
                      make_models, params, reset_accelerate_state)
from gan_accel import (Callback, GANTrainer, Phase, PhaseError, PreflightError, TrainConfig, default_phases,
                       discriminator_loss, generator_loss, gradient_penalty, r1_penalty, r1_phase, sum_losses)
from gan_accel.engine.context import MicroBatch, StepContext
from gan_accel.engine.phases import PhasePlan
from gan_accel.engine.schedules import warmup_then_decay
from gan_accel.objectives.losses import LOSSES
from gan_accel.objectives.regularizers import scaled_input_gradients

pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")


class TanhD(nn.Module):
    """D(x) = sum_j v_j tanh(W x)_j + c: its input gradient has a closed form, W^T (v * (1 - tanh^2(W x)))."""

    def __init__(self, n_in: int, n_hidden: int = 5) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.W = nn.Parameter(torch.randn(n_hidden, n_in, generator=g, dtype=torch.float64))
        self.v = nn.Parameter(torch.randn(n_hidden, generator=g, dtype=torch.float64))
        self.c = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        return torch.tanh(x.flatten(1) @ self.W.T) @ self.v + self.c

    def input_gradient(self, x):
        h = torch.tanh(x.flatten(1) @ self.W.T)
        return ((1 - h ** 2) * self.v) @ self.W


def context_for(D, real, fake=None, scaler=None, phase_net="D"):
    ctx = StepContext({"G": nn.Identity(), "D": D}, scaler=scaler)
    ctx.phase = Phase("probe", phase_net, lambda c: None)
    ctx.micro = MicroBatch(real, None, fake if fake is not None else real, None)
    return ctx


# -- regularisers against hand computations -------------------------------------------------------
def test_r1_penalty_matches_the_closed_form_input_gradient():
    D = TanhD(16)
    real = make_images(6)
    penalty = r1_penalty(gamma=3.0)(context_for(D, real))
    expected = 3.0 / 2 * D.input_gradient(real).pow(2).sum(1).mean()
    torch.testing.assert_close(penalty, expected, atol=1e-12, rtol=0)
    # and its parameter gradient (the double backward) reaches every parameter, the bias included
    penalty.backward()
    assert all(p.grad is not None for p in D.parameters())


def test_gradient_penalty_matches_the_closed_form_on_interpolates():
    D = TanhD(16)
    real, fake = make_images(6, seed=1), make_images(6, seed=2)
    eps = TableEpsilon()
    gp = gradient_penalty(weight=10.0, epsilon=eps)(context_for(D, real, fake))
    mix = eps.flat[:6].view(6, 1, 1, 1)
    x_hat = mix * real + (1 - mix) * fake
    norms = D.input_gradient(x_hat).norm(dim=1)
    torch.testing.assert_close(gp, 10.0 * (norms - 1).pow(2).mean(), atol=1e-10, rtol=0)


def test_gradient_penalty_of_a_linear_critic_is_its_weight_norm_minus_one_squared():
    D = nn.Linear(16, 1).double()
    critic = lambda x: D(x.flatten(1)).squeeze(1)  # noqa: E731
    ctx = StepContext({"G": nn.Identity(), "D": critic})
    ctx.phase, ctx.micro = Phase("probe", "D", lambda c: None), MicroBatch(make_images(5), None, None, None)
    ctx.micro.fake = make_images(5, seed=9)
    ctx.micro.fake_version = 0
    gp = gradient_penalty(weight=2.0)(ctx)
    assert gp.item() == pytest.approx(2.0 * (D.weight.norm().item() - 1) ** 2, abs=1e-9)


@pytest.mark.parametrize("init_scale", [2.0 ** 12, 2.0 ** 24])
def test_penalties_are_unchanged_by_fp16_loss_scaling(init_scale):
    """Scale before autograd.grad, unscale after: the penalty and its parameter gradients are the scaler-free ones."""
    real, fake = make_images(6).float(), make_images(6, seed=4).float()
    for make in (lambda: r1_penalty(10.0), lambda: gradient_penalty(10.0, epsilon=TableEpsilon())):
        D_plain, D_scaled = TanhD(16).float(), TanhD(16).float()
        plain = make()(context_for(D_plain, real, fake))
        plain.backward()
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        scaled = make()(context_for(D_scaled, real, fake, scaler=scaler))
        torch.testing.assert_close(scaled, plain, rtol=1e-5, atol=1e-6)
        scaler.scale(scaled).backward()  # what accelerator.backward does under fp16
        for p_plain, p_scaled in zip(D_plain.parameters(), D_scaled.parameters()):
            torch.testing.assert_close(p_scaled.grad / init_scale, p_plain.grad, rtol=1e-4, atol=1e-6)


def test_an_overflowing_scale_shows_up_as_a_non_finite_penalty():
    """Scaled input gradients that overflow must not be silently finite: the GradScaler then skips the step."""
    real = make_images(4).half().requires_grad_(True)
    logits = (real * 4).flatten(1).sum(1)  # d logit / d x = 4: 4 x the penalty's scale 2**15 is beyond fp16
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 20)
    grad = scaled_input_gradients(logits.sum(), real, scaler)
    assert not torch.isfinite(grad).all()


@pytest.mark.parametrize("init_scale", [2.0 ** 16, 2.0 ** 24])
def test_a_penalty_at_the_default_fp16_scale_is_finite_and_unscaled(init_scale):
    """The gradient of a scaled sum reaches each fp16 logit as the scale itself: at Accelerate's default
    2**16 (above fp16's 65504) every penalty was inf and its update skipped. The penalty's own scale is capped."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=generator).requires_grad_(True)
    w = torch.rand(3, generator=generator) * 2 - 1  # |d logit / d x| < 1: 2**15 x that fits in fp16
    logits = (x.half() * w.half()).sum(1)  # fp16 logits, as D gives under fp16 autocast
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    grad = scaled_input_gradients(logits.sum(), x, scaler)
    (plain,) = torch.autograd.grad(logits.float().sum(), x)
    torch.testing.assert_close(grad, plain, rtol=1e-3, atol=1e-3)  # fp16 logits: fp16 precision


# -- the phase list -------------------------------------------------------------------------------
def test_default_phases_follow_the_config():
    names = lambda cfg: [p.name for p in default_phases(cfg)]  # noqa: E731
    assert names(TrainConfig()) == ["D", "G"]
    assert names(TrainConfig(n_critic=3)) == ["D", "D", "D", "G"]
    assert names(TrainConfig(n_critic=2, r1_gamma=1.0, r1_every=4)) == ["D", "R1", "D", "R1", "G"]
    non_lazy = default_phases(TrainConfig(r1_gamma=1.0, r1_every=1))
    assert [p.name for p in non_lazy] == ["D", "G"] and non_lazy[0].double_backward
    lazy = default_phases(TrainConfig(r1_gamma=1.0, r1_every=16))[1]
    assert (lazy.every, lazy.gain, lazy.tick_scheduler, lazy.net) == (16, 16.0, False, "D")


def test_every_counts_occurrences_of_the_phase_name_and_runs_the_first():
    d = Phase("D", "D", lambda c: None, new_data=True)
    reg = Phase("R", "D", lambda c: None, every=3, tick_scheduler=False)
    plan = PhasePlan([d, reg, d, reg, Phase("G", "G", lambda c: None)], ["G", "D"])
    runs = [[p.name for p in plan.advance()] for _ in range(3)]
    # R occurs twice per step: occurrences 0, 3 run (step 1 first slot, step 2 second slot)
    assert runs == [["D", "R", "D", "G"], ["D", "D", "R", "G"], ["D", "D", "G"]]
    assert plan.scheduler_steps("D", 3) == 6 + 0  # R does not tick
    assert PhasePlan([d, Phase("X", "D", lambda c: None, every=4), Phase("G", "G", lambda c: None)],
                     ["G", "D"]).scheduler_steps("D", 10) == 10 + 3  # X ticks: runs at 0, 4, 8


@pytest.mark.parametrize("phases, message", [
    ([], "the phase list is empty"),
    ([Phase("D", "D", lambda c: None, new_data=True), Phase("E", "E", lambda c: None)], "network 'E'"),
    ([Phase("G", "G", lambda c: None)], "must draw data"),
    ([Phase("D", "D", lambda c: None, new_data=True), Phase("D", "G", lambda c: None)], "two different phases"),
])
def test_malformed_phase_lists_are_refused(phases, message):
    with pytest.raises(PhaseError, match=message):
        PhasePlan(phases, ["G", "D"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(every=0), "every=0"), (dict(gain=0.0), "gain=0.0"), (dict(gain=float("inf")), "gain=inf"),
    (dict(name="a/b"), "without '/'"), (dict(loss=3), "loss must be a function"),
])
def test_malformed_phases_are_refused(kwargs, message):
    with pytest.raises(PhaseError, match=message):
        Phase(**{**dict(name="X", net="D", loss=lambda c: None), **kwargs})


def trainer_with(tmp_path, phases, *, latents=None, extra_networks=None, **overrides) -> GANTrainer:
    cfg = dict(max_steps=2, batch_size=4, z_dim=Z_DIM, log_every=1, sample_every=1000, num_samples=4,
               output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    G, D = make_models()
    latents = latents or TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(make_images(64), cfg["batch_size"]), TrainConfig(**cfg),
                         latent_sampler=latents, phases=phases, extra_networks=extra_networks)
    latents.rewind()
    return trainer


@pytest.mark.parametrize("net, loss, message", [
    ("D", lambda ctx: ctx.missing, "phase 'X' failed on a 2-sample batch: AttributeError"),
    ("D", lambda ctx: ctx.discriminate(ctx.real), r"must return a scalar tensor .* got \(2,\)"),
    ("G", lambda ctx: ctx.discriminate(ctx.real).mean(), "does not depend on network 'G'"),
])
def test_a_broken_phase_is_caught_before_training(tmp_path, net, loss, message):
    phases = [*default_phases(TrainConfig(z_dim=Z_DIM)), Phase("X", net, loss)]
    with pytest.raises(PreflightError, match=message):
        trainer_with(tmp_path, phases)
    assert not (tmp_path / "run").exists(), "nothing may be written before training"


# -- isolation, for every phase, an extra network included ------------------------------------------
class Encoder(nn.Module):
    """Maps images back to latents: trained on detached fakes to recover the latents that made them."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(math.prod(IMAGE_SHAPE), Z_DIM)

    def forward(self, x):
        return self.net(x.flatten(1))


def encoder_loss(ctx):
    return (ctx.nets["E"](ctx.fake) - ctx.latents).pow(2).mean()


def second_g_loss(ctx):
    """A second G objective, a per-sample mean (as accumulation needs): pull each sample towards its paired real one."""
    return (ctx.fake - ctx.real).abs().mean()


def extra_phases(loss_name="nonsaturating", r1_every=2, gp=None):
    loss = LOSSES[loss_name]
    d_loss = discriminator_loss(loss) if gp is None else sum_losses(discriminator_loss(loss), gp)
    return [Phase("D", "D", d_loss, new_data=True), r1_phase(1.0, every=r1_every),
            Phase("G", "G", generator_loss(loss)), Phase("G2", "G", second_g_loss, tick_scheduler=False)]


class Snapshots(Callback):
    def __init__(self):
        self.records = []

    def on_fit_start(self, trainer):
        self.records.append(("start", {n: params(m) for n, m in trainer.networks.items()}, None))

    def on_phase_end(self, trainer, phase):
        grads = {n: [p.grad for p in m.parameters()] for n, m in trainer.networks.items()}
        self.records.append((phase, {n: params(m) for n, m in trainer.networks.items()}, grads))


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_every_phase_moves_only_its_network_extra_network_included(tmp_path, grad_accum_steps):
    torch.manual_seed(0)
    phases = [*extra_phases(r1_every=1), Phase("E", "E", encoder_loss)]
    trainer = trainer_with(tmp_path, phases, extra_networks={"E": Encoder().double()},
                           grad_accum_steps=grad_accum_steps, lr_schedule="constant", warmup_ratio=0.0)
    spy = Snapshots()
    trainer.callbacks.add(spy)
    trainer.fit()
    assert [r[0].name for r in spy.records[1:]] == ["D", "R1", "G", "G2", "E"] * 2
    for (_, before, _), (phase, after, grads) in zip(spy.records, spy.records[1:]):
        for name in trainer.networks:
            if name == phase.net:
                assert any(not torch.equal(after[name][k], before[name][k]) for k in before[name]), phase.name
            else:
                assert_close_dicts(after[name], before[name], atol=0)
            assert all(g is None for g in grads[name]), f"{phase.name} left gradients in {name}"
    assert all(p.requires_grad for m in trainer.networks.values() for p in m.parameters())


def test_a_parameter_frozen_by_the_user_stays_frozen(tmp_path):
    G, D = make_models()
    frozen = D.net[1].bias.requires_grad_(False)
    before = frozen.detach().clone()
    latents = TableLatents(4096)
    config = TrainConfig(max_steps=3, batch_size=4, z_dim=Z_DIM, num_samples=4, output_dir=str(tmp_path / "run"),
                         progress_bar=False)
    GANTrainer(G, D, make_loader(make_images(32), 4), config, latent_sampler=latents).fit()
    assert not frozen.requires_grad and torch.equal(frozen.detach(), before)


# -- accumulation == larger batch, with extra phases ----------------------------------------------------
@pytest.mark.parametrize("k", [2, 3])
def test_accumulation_equals_larger_batch_with_r1_gp_and_a_second_g_loss(tmp_path, k):
    b, steps = 4, 4
    images = make_images(k * b * steps * 2)

    def run(folder, batch, accum):
        reset_accelerate_state()
        G, D = make_models()
        latents = TableLatents(8192)
        config = TrainConfig(max_steps=steps, batch_size=batch, grad_accum_steps=accum, z_dim=Z_DIM, log_every=1,
                             sample_every=1000, num_samples=4, output_dir=str(tmp_path / folder),
                             progress_bar=False, lr_G=1e-2, lr_D=1e-2, warmup_ratio=0.25, loss="wasserstein")
        epsilon = TableEpsilon()
        phases = extra_phases("wasserstein", r1_every=2, gp=gradient_penalty(10.0, epsilon=epsilon))
        trainer = GANTrainer(G, D, make_loader(images, batch), config, latent_sampler=latents, phases=phases)
        latents.rewind()
        epsilon.rewind()
        trainer.fit()
        return trainer

    small, big = run("small", b, k), run("big", k * b, 1)
    assert small.runner.phase_runs == big.runner.phase_runs == {"D": 4, "R1": 2, "G": 4, "G2": 4}
    assert_close_dicts(params(small.G), params(big.G), atol=1e-10)
    assert_close_dicts(params(small.D), params(big.D), atol=1e-10)


# -- a plain PyTorch twin of a run with lazy R1 ------------------------------------------------------
def plain_twin_with_lazy_r1(images, batch, steps, latents, gamma, every, lr=1e-2, warmup=0.4):
    """D step, every `every`-th D step an extra D step on gain*R1 (no scheduler tick), then G: by hand."""
    loss = LOSSES["nonsaturating"]
    G, D = make_models(0)
    opt_G = torch.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)  # as gan_accel builds it
    opt_D = torch.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)
    curve = warmup_then_decay(steps, int(warmup * steps), "linear")
    sched_G, sched_D = (torch.optim.lr_scheduler.LambdaLR(o, curve) for o in (opt_G, opt_D))
    for step in range(steps):
        real = images[step * batch:(step + 1) * batch]
        fake = G(latents(batch, torch.device("cpu")))
        opt_D.zero_grad()
        loss.d_loss(D(real), D(fake.detach())).backward()
        opt_D.step()
        sched_D.step()
        if step % every == 0:
            opt_D.zero_grad()
            x = real.detach().requires_grad_(True)
            logits = D(x)
            (grad,) = torch.autograd.grad(logits.sum(), x, create_graph=True)
            # + 0 * logits: every parameter gets a gradient, as DDP needs (StyleGAN2 does the same); with
            # Adam a zero gradient is not a no-op (the momentum still moves D's last bias)
            (every * (gamma / 2 * grad.pow(2).flatten(1).sum(1).mean() + 0 * logits.sum())).backward()
            opt_D.step()  # no scheduler tick
        opt_G.zero_grad()
        for p in D.parameters():
            p.requires_grad_(False)
        loss.g_loss(D(fake)).backward()
        for p in D.parameters():
            p.requires_grad_(True)
        opt_G.step()
        sched_G.step()
    return params(G), params(D)


def test_engine_with_lazy_r1_matches_a_hand_written_loop(tmp_path):
    steps, b = 5, 8
    images = make_images(steps * b)
    latents = TableLatents(4096)
    G, D = make_models()
    config = TrainConfig(max_steps=steps, batch_size=b, z_dim=Z_DIM, log_every=1, sample_every=1000, num_samples=4,
                         output_dir=str(tmp_path / "run"), progress_bar=False, lr_G=1e-2, lr_D=1e-2, warmup_ratio=0.4,
                         r1_gamma=5.0, r1_every=2)
    trainer = GANTrainer(G, D, make_loader(images, b), config, latent_sampler=latents)
    latents.rewind()
    trainer.fit()
    assert trainer.runner.phase_runs == {"D": 5, "R1": 3, "G": 5}
    twin_G, twin_D = plain_twin_with_lazy_r1(images, b, steps, TableLatents(4096), gamma=5.0, every=2)
    assert_close_dicts(params(trainer.G), twin_G, atol=1e-12)
    assert_close_dicts(params(trainer.D), twin_D, atol=1e-12)


# -- n_critic with a lazy regulariser ---------------------------------------------------------------------
def test_n_critic_with_lazy_r1_counts_steps_and_ticks(tmp_path):
    steps, n_critic, every = 3, 4, 3
    from test_engine import count_optimizer_steps

    trainer = trainer_with(tmp_path, None, max_steps=steps, n_critic=n_critic, r1_gamma=1.0, r1_every=every,
                           warmup_ratio=0.25, lr_D=1e-2)
    counts = count_optimizer_steps(trainer)
    trainer.fit()
    r1_runs = math.ceil(n_critic * steps / every)  # every 3rd of 12 D steps, the first included
    assert trainer.runner.phase_runs == {"D": 12, "R1": r1_runs, "G": 3}
    assert counts == {"G": steps, "D": n_critic * steps + r1_runs}
    assert trainer.sched_D.scheduler.last_epoch == n_critic * steps, "R1 must not tick D's schedule"
    expected = warmup_then_decay(n_critic * steps, int(0.25 * n_critic * steps))(n_critic * steps)
    assert trainer.opt_D.param_groups[0]["lr"] == pytest.approx(1e-2 * expected)
