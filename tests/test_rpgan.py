"""RpGAN with R1 and R2 (R3GAN's loss): by hand, under accumulation, as a plain loop, on 2 processes."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from conftest import (TableLatents, assert_close_dicts, launch_two_processes, make_images, make_loader, make_models,
                      params, reset_accelerate_state)
from gan_accel import GANTrainer, TrainConfig, default_phases, discriminator_loss, generator_loss
from gan_accel.engine.schedules import warmup_then_decay
from gan_accel.objectives.losses import LOSSES
from test_phases import TanhD, context_for

pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
RPGAN = LOSSES["rpgan"]


def test_rpgan_losses_are_the_paired_logistic_losses():
    g = torch.Generator().manual_seed(0)
    real, fake = torch.randn(32, generator=g, dtype=torch.float64) * 3, torch.randn(32, generator=g, dtype=torch.float64)
    # -log sigmoid(D(x_i) - D(G(z_i))) and -log sigmoid(D(G(z_i)) - D(x_i)), sample by sample
    expected_d = sum(-torch.log(torch.sigmoid(r - f)) for r, f in zip(real, fake)) / 32
    expected_g = sum(-torch.log(torch.sigmoid(f - r)) for r, f in zip(real, fake)) / 32
    torch.testing.assert_close(RPGAN.d_loss(real, fake), expected_d, atol=1e-12, rtol=0)
    torch.testing.assert_close(RPGAN.g_loss(fake, real), expected_g, atol=1e-12, rtol=0)
    assert RPGAN.relativistic and TrainConfig(loss="rpgan").loss_fn is RPGAN


@pytest.mark.parametrize("scale", [None, 2.0 ** 12], ids=["fp32", "fp16-scaler"])
def test_d_loss_with_r1_and_r2_matches_the_closed_form(scale):
    """loss + gamma1/2 E|grad D(x)|^2 + gamma2/2 E|grad D(G(z))|^2, with D's input gradient in closed form;
    under a GradScaler (fp16) the value and the unscaled parameter gradients are the same."""
    real, fake = make_images(6, seed=1), make_images(6, seed=2)
    dtype = torch.float64 if scale is None else torch.float32
    real, fake = real.to(dtype), fake.to(dtype)
    D, twin = TanhD(16).to(dtype), TanhD(16).to(dtype)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale) if scale else None
    value = discriminator_loss(RPGAN, r1_gamma=3.0, r2_gamma=0.5)(context_for(D, real, fake, scaler=scaler))
    grad_norm2 = lambda x: twin.input_gradient(x).pow(2).sum(1).mean()  # noqa: E731
    expected = F.softplus(twin(fake) - twin(real)).mean() + 1.5 * grad_norm2(real) + 0.25 * grad_norm2(fake)
    tol = dict(atol=1e-12, rtol=0) if scale is None else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(value, expected, **tol)
    (scaler.scale(value) / scale if scaler else value).backward()
    expected.backward()
    for p, q in zip(D.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol)


def test_g_loss_reads_the_real_logits_and_trains_only_through_the_fakes():
    real, fake = make_images(6, seed=1), make_images(6, seed=2).requires_grad_(True)
    D = TanhD(16)
    for p in D.parameters():
        p.requires_grad_(False)  # the engine freezes D in G's phase
    ctx = context_for(D, real, phase_net="G")
    ctx.micro.fake, ctx.micro.fake_version, ctx.micro.fake_has_graph = fake, 0, True
    value = generator_loss(RPGAN)(ctx)
    torch.testing.assert_close(value, F.softplus(D(real) - D(fake)).mean(), atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad(value, fake)
    # d/dx_fake of mean softplus(D(x_r) - D(x_f)) = -sigmoid(D(x_r) - D(x_f)) / N * grad D(x_f)
    weights = -torch.sigmoid(D(real) - D(fake)) / 6
    torch.testing.assert_close(grad.flatten(1), weights[:, None] * D.input_gradient(fake), atol=1e-12, rtol=0)


def test_the_phase_list_of_the_r3gan_recipe_and_its_lazy_form():
    eager = default_phases(TrainConfig(loss="rpgan", r1_gamma=1.0, r2_gamma=1.0, r1_every=1))
    assert [p.name for p in eager] == ["D", "G"] and eager[0].double_backward
    lazy = default_phases(TrainConfig(loss="rpgan", r1_gamma=1.0, r2_gamma=1.0, r1_every=4))
    assert [p.name for p in lazy] == ["D", "R1R2", "G"] and (lazy[1].every, lazy[1].gain) == (4, 4.0)
    assert [p.name for p in default_phases(TrainConfig(r2_gamma=1.0, r1_every=4))] == ["D", "R2", "G"]


def make_trainer(folder, images, batch_size, steps, models=make_models, **overrides) -> GANTrainer:
    reset_accelerate_state()
    G, D = models(0)
    latents = TableLatents(4096)
    options = dict(loss="rpgan", r1_gamma=2.0, r2_gamma=1.0, r1_every=1, lr_G=1e-2, lr_D=1e-2, warmup_ratio=0.4)
    config = TrainConfig(max_steps=steps, batch_size=batch_size, z_dim=4, log_every=1, sample_every=1000,
                         num_samples=4, output_dir=str(folder), progress_bar=False, **{**options, **overrides})
    trainer = GANTrainer(G, D, make_loader(images, batch_size), config, latent_sampler=latents)
    latents.rewind()
    return trainer


@pytest.mark.parametrize("k, r1_every", [(2, 1), (3, 2)], ids=["k2-every-step", "k3-lazy"])
def test_accumulation_equals_larger_batch(tmp_path, k, r1_every):
    b, steps = 4, 4
    images = make_images(k * b * steps * 2)
    small = make_trainer(tmp_path / "small", images, b, steps, grad_accum_steps=k, r1_every=r1_every)
    small.fit()
    big = make_trainer(tmp_path / "big", images, k * b, steps, r1_every=r1_every)
    big.fit()
    assert small.runner.phase_runs == big.runner.phase_runs
    assert_close_dicts(params(small.G), params(big.G), atol=1e-10)
    assert_close_dicts(params(small.D), params(big.D), atol=1e-10)


def plain_rpgan_loop(images, batch, steps, gamma1=2.0, gamma2=1.0, lr=1e-2, warmup=0.4, models=make_models):
    """R3GAN's step by hand: D on RpGAN + R1 + R2 from the same two forwards, then G through a frozen D."""
    G, D = models(0)
    latents = TableLatents(4096)
    opt_G = torch.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)  # as gan_accel builds it
    opt_D = torch.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)
    curve = warmup_then_decay(steps, int(warmup * steps), "linear")
    sched_G, sched_D = (torch.optim.lr_scheduler.LambdaLR(o, curve) for o in (opt_G, opt_D))
    for step in range(steps):
        real = images[step * batch:(step + 1) * batch]
        fake = G(latents(batch, torch.device("cpu")))
        x_real, x_fake = real.detach().requires_grad_(True), fake.detach().requires_grad_(True)
        d_real, d_fake = D(x_real), D(x_fake)
        (g_real,) = torch.autograd.grad(d_real.sum(), x_real, create_graph=True)
        (g_fake,) = torch.autograd.grad(d_fake.sum(), x_fake, create_graph=True)
        loss = F.softplus(-(d_real - d_fake)).mean() + gamma1 / 2 * g_real.pow(2).flatten(1).sum(1).mean() \
            + gamma2 / 2 * g_fake.pow(2).flatten(1).sum(1).mean()
        loss.backward()
        opt_D.step()
        sched_D.step()
        opt_D.zero_grad()
        D.requires_grad_(False)
        F.softplus(-(D(fake) - D(real))).mean().backward()
        D.requires_grad_(True)
        opt_G.step()
        sched_G.step()
        opt_G.zero_grad()
    return params(G), params(D)


def test_engine_matches_a_plain_pytorch_loop(tmp_path):
    steps, b = 5, 8
    images = make_images(steps * b)
    trainer = make_trainer(tmp_path / "run", images, b, steps)
    trainer.fit()
    twin_G, twin_D = plain_rpgan_loop(images, b, steps)
    assert_close_dicts(params(trainer.G), twin_G, atol=1e-12)
    assert_close_dicts(params(trainer.D), twin_D, atol=1e-12)
    # the penalties moved D: the twin without them ends elsewhere
    _, plain_D = plain_rpgan_loop(images, b, steps, gamma1=0.0, gamma2=0.0)
    assert max((plain_D[k] - twin_D[k]).abs().max() for k in twin_D) > 1e-4


def _train(out_dir: str, batch_size: int) -> None:
    """On every process: 3 steps of RpGAN + R1 + R2 with accumulation 2; saves what the rank ended with."""
    from accelerate import PartialState

    trainer = make_trainer(os.path.join(out_dir, "run"), make_images(96), batch_size, 3, grad_accum_steps=2,
                           warmup_ratio=0.0)
    trainer.fit()
    torch.save({"G": params(trainer.G), "D": params(trainer.D), "world": trainer.accelerator.num_processes},
               os.path.join(out_dir, f"rank{PartialState().process_index}.pt"))


@pytest.mark.slow  # one launch of 2 processes: ~40 s on 2 loaded cores
def test_two_processes_equal_one_process_with_double_batch(tmp_path):
    """R1 and R2's input gradients bypass DDP's reducer: only the loss's design makes the ranks agree."""
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    launch_two_processes(_train, args=(str(tmp_path / "two"), 4), num_processes=2)
    rank0, rank1 = (torch.load(tmp_path / "two" / f"rank{r}.pt") for r in (0, 1))
    assert rank0["world"] == 2
    assert_close_dicts(rank0["D"], rank1["D"], atol=0)
    _train(str(tmp_path / "one"), 8)
    single = torch.load(tmp_path / "one" / "rank0.pt")
    assert_close_dicts(rank0["G"], single["G"], atol=1e-10)
    assert_close_dicts(rank0["D"], single["D"], atol=1e-10)
