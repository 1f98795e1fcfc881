"""Augmentation in the engine: every image D sees goes through it (reals, fakes, G's samples in G's phase,
the reals of R1 and the interpolates of the gradient penalty), penalties take their input gradient through
it (hand-computed), ADA's p moves by its rule in a real run and is the same on every process (the
statistic is summed across ranks first). Bitwise resume with ADA and DiffAugment is in test_resume.py."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from conftest import (TableLatents, launch_two_processes, make_images, make_loader, make_models, reset_accelerate_state)
from gan_accel import GANTrainer, Phase, TrainConfig, gradient_penalty, r1_penalty
from gan_accel.engine.context import MicroBatch, StepContext
from gan_accel.objectives import discriminator_loss, generator_loss
from gan_accel.objectives.losses import LOSSES


class Doubling:
    """A deterministic stand-in augmentation: ``x -> 2 x`` (differentiable, with a ``p`` like the real ones)."""

    p = 1.0

    def __call__(self, x):
        return 2 * x


class LinearD(nn.Module):
    """``D(x) = <w, x>``, recording every input it is called with."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-0.5, 0.5, n, dtype=torch.float64))
        self.inputs: list[torch.Tensor] = []

    def forward(self, x):
        self.inputs.append(x.detach().clone())
        return x.flatten(1) @ self.w


def context(D, real, fake, G=None):
    ctx = StepContext({"G": G or nn.Identity(), "D": D}, augment=Doubling())
    ctx.phase, ctx.micro = Phase("probe", "D", lambda c: None), MicroBatch(real, None, real, None)
    ctx.micro.fake, ctx.micro.fake_version = fake, 0
    return ctx


def test_every_image_D_sees_goes_through_the_augmentation():
    real, fake = make_images(5, seed=1), make_images(5, seed=2)
    D = LinearD(real[0].numel())
    discriminator_loss(LOSSES["nonsaturating"])(context(D, real, fake))
    assert [torch.equal(seen, 2 * x) for seen, x in zip(D.inputs, (real, fake))] == [True, True]
    D.inputs.clear()
    generator_loss(LOSSES["nonsaturating"])(context(D, real, fake))
    assert len(D.inputs) == 1 and torch.equal(D.inputs[0], 2 * fake)
    D.inputs.clear()
    r1_penalty(1.0)(context(D, real, fake))
    assert len(D.inputs) == 1 and torch.equal(D.inputs[0], 2 * real)


def test_penalties_take_their_input_gradient_through_the_augmentation():
    """R1 and WGAN-GP differentiate D(augment(x)) with respect to the un-augmented x: for D(2x) = <w, 2x>
    that gradient is 2w, so R1 = gamma/2 |2w|^2 and GP = weight (|2w| - 1)^2, computed by hand."""
    real, fake = make_images(5, seed=1), make_images(5, seed=2)
    D = LinearD(real[0].numel())
    norm = (2 * D.w).norm().item()
    r1 = r1_penalty(3.0)(context(D, real, fake))
    assert r1.item() == pytest.approx(3.0 / 2 * norm ** 2, rel=1e-12)
    gp = gradient_penalty(10.0)(context(D, real, fake))
    assert gp.item() == pytest.approx(10.0 * (norm - 1) ** 2, rel=1e-12)


def test_G_learns_through_the_augmentation():
    """In G's phase D sees augment(G(z)) with its graph: G's gradient passes through the augmentation."""
    real = make_images(5, seed=1)
    G = nn.Linear(3, real[0].numel(), dtype=torch.float64)
    D = LinearD(real[0].numel())
    ctx = context(D, real, None, G=lambda z: G(z).view_as(real))
    ctx.phase, ctx.micro.latents, ctx.micro.fake = Phase("G", "G", lambda c: None), torch.ones(5, 3, dtype=torch.float64), None
    loss = generator_loss(LOSSES["wasserstein"])(ctx)  # -mean D(2 G(z)) = -2 <w, G(z)> averaged
    loss.backward()
    torch.testing.assert_close(G.bias.grad, -2 * D.w.detach(), rtol=1e-12, atol=1e-12)


# -- ADA in a real run -------------------------------------------------------------------------------------
class SignD(nn.Module):
    """A D whose logits have a fixed sign on the data: ``sign * 100`` plus a tiny trainable part (the
    preflight wants D's loss to depend on D's parameters; lr_D is tiny, so the sign never changes)."""

    def __init__(self, inner: nn.Module, sign: float) -> None:
        super().__init__()
        self.inner, self.sign = inner, sign

    def forward(self, x):
        return self.sign * 100.0 + 1e-3 * self.inner(x)


class MeanD(nn.Module):
    """D(x) = 100 x's mean - 1000 (+ a tiny trainable part): every logit is negative, but reals at 1 score
    above G's tanh samples, so the two losses' statistics disagree in sign."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return 100.0 * x.flatten(1).mean(1) - 1000.0 + 1e-3 * self.inner(x)


def ada_run(tmp_path, sign: float, start_p: float, steps: int = 5, loss: str = "nonsaturating",
            mean_d: bool = False) -> list[dict]:
    G, D = make_models()
    out = tmp_path / f"ada_{sign}_{loss}"
    config = TrainConfig(max_steps=steps, batch_size=4, z_dim=4, lr_D=1e-12, log_every=1, sample_every=steps,
                         num_samples=4, output_dir=str(out), progress_bar=False, loss=loss,
                         augment="ada", augment_p=start_p, ada_interval=1, ada_kimg=0.1)
    images = torch.ones(4 * steps, *make_images(1).shape[1:], dtype=torch.float64) if mean_d else make_images(4 * steps)
    trainer = GANTrainer(G, MeanD(D) if mean_d else SignD(D, sign), make_loader(images, 4), config,
                         latent_sampler=TableLatents(4096))
    trainer.fit()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("sign, start_p", [(+1.0, 0.0), (-1.0, 0.5)], ids=["overfitting D: p rises",
                                                                          "D unsure of the reals: p falls"])
def test_ada_moves_p_by_its_rule_in_a_run(tmp_path, sign, start_p):
    """r_t = +1 (D certain of every real) is above the target 0.6: p rises by 4 images / 100 each step;
    r_t = -1 is below: p falls by as much; exactly, computed the way the rule says."""
    rows = ada_run(tmp_path, sign, start_p)
    expected, p = [], start_p
    for _ in rows:
        p = min(max(p + sign * 4 / (0.1 * 1000), 0.0), 0.99)
        expected.append(p)
    assert [row["augment/p"] for row in rows] == expected
    assert {row["augment/rt"] for row in rows} == {sign}


@pytest.mark.parametrize("loss, rt", [("nonsaturating", -1.0), ("rpgan", 1.0)])
def test_ada_statistic_for_a_relativistic_loss_is_real_against_fake(tmp_path, loss, rt):
    """RpGAN's logits have no fixed zero (only D(x) - D(G(z)) enters its loss), so ADA's sign(D(x)) says nothing
    there: its statistic is the share of pairs where the real image outscores G's. Every logit of MeanD is
    negative (ADA's r_t = -1: p stays at 0) while every real outscores every fake (RpGAN's = +1: p rises by
    4 images / 100). One step at p = 0, so no augmentation moves the images."""
    (row,) = ada_run(tmp_path, rt, 0.0, steps=1, loss=loss, mean_d=True)
    assert (row["augment/rt"], row["augment/p"]) == (rt, max(rt, 0) * 4 / 100)


def _ada_two_ranks(out_dir: str) -> None:
    """Rank 0 sees only bright images (D(x) > 0), rank 1 only dark ones (D(x) < 0): the summed statistic is 0."""
    from accelerate import PartialState

    G, D = make_models()
    images = torch.cat([torch.full((4, 1, 4, 4), 0.9 if i % 2 == 0 else -0.9) for i in range(12)]).double()
    # the batches alternate between bright and dark: Accelerate gives rank r the batches r, r + 2, ...
    config = TrainConfig(max_steps=5, batch_size=4, z_dim=4, lr_D=1e-12, log_every=1, sample_every=5,
                         num_samples=4, output_dir=os.path.join(out_dir, "run"), progress_bar=False,
                         augment="ada", ada_interval=1, ada_kimg=0.1)
    trainer = GANTrainer(G, MeanSignD(D), make_loader(images, 4), config, latent_sampler=TableLatents(4096))
    trainer.fit()
    torch.save({"p": trainer.runner.augmentation.controller.p, "rt": trainer.runner.augmentation.controller.rt},
               os.path.join(out_dir, f"rank{PartialState().process_index}.pt"))


class MeanSignD(nn.Module):
    """D(x) = 100 x's mean (+ a tiny trainable part): its sign is the data's."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return 100.0 * x.flatten(1).mean(1) + 1e-3 * self.inner(x)


@pytest.mark.slow
def test_ada_p_is_the_same_on_every_process_from_the_summed_statistic(tmp_path):
    """Alone, rank 0 (r_t = +1) would raise p and rank 1 (r_t = -1) would hold it at 0. Summed across ranks
    r_t is exactly 0, below the target: p stays 0 on both, and with it no image is augmented."""
    launch_two_processes(_ada_two_ranks, args=(str(tmp_path),), num_processes=2)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0 == rank1 == {"p": 0.0, "rt": 0.0}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["augment/rt"] for row in rows] == [0.0] * 5
    reset_accelerate_state()
    bright = ada_run(tmp_path, +1.0, 0.0, steps=5)  # the same rule on one rank's data alone: p moves
    assert bright[-1]["augment/p"] > 0
