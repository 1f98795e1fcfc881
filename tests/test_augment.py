"""Augmentations for D: exact at p = 0, differentiable, each transform against a hand computation; the ADA
controller's step against its formula, its state, its reduction over processes; R1 through an augmentation."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch
from torch import nn

from gan_accel.augment import AdaAugment, AdaDraws, AdaptiveP, DiffAugment, NoAugment, build_augment
from gan_accel.augment.color import apply_color, color_transform
from gan_accel.augment.diffaugment import brightness_saturation_contrast, cut_out, shift_with_zeros
from gan_accel.engine.context import MicroBatch, StepContext
from gan_accel.engine.phases import Phase
from gan_accel.objectives.regularizers import r1_penalty


def known_image(n: int = 2, channels: int = 3, size: int = 6, dtype=torch.float64) -> torch.Tensor:
    """Every pixel distinct (so any misplaced copy shows), including -0.0 (so any arithmetic on it shows)."""
    x = torch.arange(n * channels * size * size, dtype=dtype).view(n, channels, size, size) / 7 - 3
    x[0, 0, 0, 0] = -0.0
    return x


def all_augments(p: float) -> list[nn.Module]:
    return [DiffAugment(p=p), DiffAugment("translation", p=p), AdaAugment(p=p),
            AdaAugment(p=p, geometric=True), AdaAugment(p=p, blit=False)]


# -- p = 0 and samples that draw nothing -------------------------------------------------------------------
def test_p_zero_returns_the_input_itself_and_draws_nothing():
    x = known_image()
    for augment in [NoAugment(), *all_augments(0.0)]:
        state = torch.get_rng_state()
        out = augment(x)
        assert out is x, type(augment).__name__
        assert torch.equal(torch.get_rng_state(), state), f"{augment} drew random numbers at p=0"


def test_ada_samples_that_draw_no_transform_keep_their_bytes():
    torch.manual_seed(0)
    x = torch.randn(64, 3, 8, 8)
    x[:, 0, 0, 0] = -0.0
    augment = AdaAugment(p=0.05, geometric=True)
    torch.manual_seed(1)
    draws = augment.draw(64, 8, 8, x.device)
    out = augment.apply(x, draws)
    untouched = (~draws.flip & (draws.quarter_turns == 0) & (draws.shift == 0).all(1) & ~draws.color_selected
                 & ~draws.geometry_selected)
    assert 20 < untouched.sum() < 64  # the test sees both kinds
    before, after = x[untouched].numpy().tobytes(), out[untouched].numpy().tobytes()
    assert before == after
    assert not torch.equal(out[~untouched], x[~untouched])


def test_forward_is_apply_of_its_own_draws():
    x = torch.randn(5, 3, 8, 8)
    augment = AdaAugment(p=0.6, geometric=True)
    torch.manual_seed(3)
    out = augment(x)
    torch.manual_seed(3)
    assert torch.equal(out, augment.apply(x, augment.draw(5, 8, 8, x.device)))


def test_half_precision_channels_last_batches_keep_their_dtype_and_layout():
    x = (torch.rand(4, 3, 8, 8) * 2 - 1).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    for augment in all_augments(0.8):
        out = augment(x)
        assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last), augment
        assert torch.isfinite(out.float()).all()


# -- differentiable -------------------------------------------------------------------------------------
@pytest.mark.parametrize("augment", [DiffAugment("color"), DiffAugment("translation"), DiffAugment("cutout"),
                                     DiffAugment(p=0.5), AdaAugment(p=0.8, color=False), AdaAugment(p=0.8, blit=False),
                                     AdaAugment(p=0.8, blit=False, color=False, geometric=True)],
                         ids=["diff-color", "diff-translation", "diff-cutout", "diff-all-p0.5", "ada-blit",
                              "ada-color", "ada-geometric"])
def test_every_augmentation_has_the_gradient_of_a_finite_difference(augment):
    """gradcheck in float64: each call re-seeds, so the function of x is fixed while it is probed. fast_mode
    compares the analytic and numerical Jacobians projected on random vectors (a few calls instead of one per
    input element); a wrong or missing gradient still fails it."""
    x = (torch.rand(2, 3, 5, 5, dtype=torch.float64) * 2 - 1).requires_grad_(True)

    def fixed(inp):
        torch.manual_seed(5)
        return augment(inp)

    torch.manual_seed(5)
    assert not torch.equal(augment(x.detach()), x.detach()), "the seed must draw some transform"
    # bilinear resampling is piecewise linear in the sampling position, linear in x: exact differences
    assert torch.autograd.gradcheck(fixed, (x,), eps=1e-6, atol=1e-7, fast_mode=True)


# -- hand computations on known images -------------------------------------------------------------------
def numpy_shift(image: np.ndarray, dy: int, dx: int, mode: str) -> np.ndarray:
    """(C, H, W) moved by (dy, dx): output (i, j) shows input (i - dy, j - dx); ``mode`` is numpy.pad's border."""
    pad = max(abs(dy), abs(dx), 1)
    padded = np.pad(image, ((0, 0), (pad, pad), (pad, pad)), mode=mode)
    h, w = image.shape[1:]
    return padded[:, pad - dy:pad - dy + h, pad - dx:pad - dx + w]


def test_diffaugment_translation_fills_with_zeros_like_a_padded_crop():
    x = known_image(4)
    shift = torch.tensor([[1, -2], [0, 0], [-3, 3], [2, 1]])
    out = shift_with_zeros(x, shift)
    for n in range(4):
        expected = numpy_shift(x[n].numpy(), *shift[n].tolist(), mode="constant")
        np.testing.assert_array_equal(out[n].numpy(), expected)
    # the module: the same with the shifts it drew (two randint calls, rows then columns, each in [-1, 1] at 6 px)
    torch.manual_seed(11)
    drawn = DiffAugment("translation")(x)
    torch.manual_seed(11)
    rows, cols = torch.randint(-1, 2, (4,)), torch.randint(-1, 2, (4,))
    assert torch.equal(drawn, shift_with_zeros(x, torch.stack([rows, cols], 1)))


def test_cutout_zeroes_a_half_size_square_clipped_at_the_border():
    x = known_image(3, size=8)
    centre = torch.tensor([[4, 4], [0, 7], [7, 1]])
    out = cut_out(x, centre, side=4)
    for n, (cy, cx) in enumerate(centre.tolist()):
        expected = x[n].numpy().copy()
        expected[:, max(cy - 2, 0):cy + 2, max(cx - 2, 0):cx + 2] = 0
        np.testing.assert_array_equal(out[n].numpy(), expected)
    torch.manual_seed(4)
    drawn = DiffAugment("cutout")(x)
    torch.manual_seed(4)
    again = torch.stack([torch.randint(0, 8, (3,)), torch.randint(0, 8, (3,))], 1)
    assert torch.equal(drawn, cut_out(x, again, side=4))
    assert (drawn == 0).flatten(1).sum(1).min() >= 3 * 4  # at least a clipped quarter of the square


def test_diffaugment_colour_matches_its_formula():
    x = known_image(2)
    b, s, c = torch.tensor([0.3, -0.1]), torch.tensor([1.5, 0.0]), torch.tensor([0.7, 1.2])
    out = brightness_saturation_contrast(x, b, s, c).numpy()
    for n in range(2):
        y = x[n].numpy() + b[n].item()
        y = (y - y.mean(0)) * s[n].item() + y.mean(0)
        y = (y - y.mean()) * c[n].item() + y.mean()
        np.testing.assert_allclose(out[n], y, rtol=0, atol=1e-12)
    assert np.allclose(out[1], out[1][0:1]), "saturation 0 makes every channel the grey mean"


@pytest.mark.parametrize("flip, turns, shift", [(False, 0, (0, 0)), (True, 0, (0, 0)), (False, 1, (0, 0)),
                                                (False, 3, (0, 0)), (False, 0, (2, -1)), (True, 2, (-1, 2)),
                                                (True, 1, (3, 3))])
def test_ada_blit_is_flip_then_rotation_then_reflected_shift(flip, turns, shift):
    x = known_image(1, size=5)
    augment = AdaAugment(p=1.0, color=False)
    draws = AdaDraws(torch.tensor([flip]), torch.tensor([turns]), torch.tensor([shift]), None, None, None, None)
    out = augment.apply(x, draws)[0].numpy()
    expected = x[0].numpy()
    if flip:
        expected = expected[:, :, ::-1]
    expected = np.rot90(expected, turns, axes=(1, 2))
    expected = numpy_shift(np.ascontiguousarray(expected), *shift, mode="reflect")
    np.testing.assert_array_equal(out, expected)
    assert torch.equal(torch.rot90(x, turns, dims=(2, 3))[0], augment.apply(
        x, AdaDraws(torch.tensor([False]), torch.tensor([turns]), torch.tensor([[0, 0]]), None, None, None, None))[0])


def test_ada_colour_transforms_by_hand():
    x = known_image(1).float()
    zero, one = torch.zeros(1), torch.ones(1)
    no = torch.zeros(1, dtype=torch.bool)

    def colour(b=zero, c=one, flip=no, hue=zero, s=one, image=x):
        return apply_color(image, *color_transform(b, c, flip, hue, s))

    torch.testing.assert_close(colour(b=torch.tensor([0.25])), x + 0.25)
    torch.testing.assert_close(colour(c=torch.tensor([1.5])), x * 1.5)
    # a third of a turn about the grey axis moves red to green, green to blue, blue to red
    third = colour(hue=torch.tensor([2 * math.pi / 3]))
    torch.testing.assert_close(third, x[:, [2, 0, 1]], atol=1e-5, rtol=0)
    # the luma flip mirrors through the grey plane: grey part negated, colour part kept
    grey = x.mean(1, keepdim=True)
    torch.testing.assert_close(colour(flip=torch.ones(1, dtype=torch.bool)), x - 2 * grey, atol=1e-5, rtol=0)
    torch.testing.assert_close(colour(s=torch.tensor([0.0])), grey.expand_as(x), atol=1e-5, rtol=0)
    # one channel is grey: brightness and contrast act, the luma flip negates, hue and saturation do nothing
    g = x[:, :1]
    torch.testing.assert_close(colour(b=torch.tensor([0.5]), c=torch.tensor([2.0]), image=g), 2 * (g + 0.5))
    torch.testing.assert_close(colour(flip=torch.ones(1, dtype=torch.bool), image=g), -g)
    torch.testing.assert_close(colour(hue=torch.tensor([1.0]), s=torch.tensor([3.0]), image=g), g, atol=1e-5, rtol=0)


def test_build_augment_by_name():
    assert isinstance(build_augment("none"), NoAugment) and build_augment("none").p == 0
    assert build_augment("diffaugment", policy="color").policy == ("color",)
    assert build_augment("ada").p == 0.0
    with pytest.raises(ValueError, match="choose one of none, diffaugment, ada"):
        build_augment("adaa")
    with pytest.raises(ValueError, match="policy 'colour'"):
        DiffAugment("colour")


# -- R1 through an augmentation --------------------------------------------------------------------------
class TanhD(nn.Module):
    """D(x) = v . tanh(W x) + c, whose input gradient is W^T (v * (1 - tanh(W x)^2))."""

    def __init__(self, n_in: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.W = nn.Parameter(torch.randn(5, n_in, generator=g, dtype=torch.float64) / math.sqrt(n_in))
        self.v = nn.Parameter(torch.randn(5, generator=g, dtype=torch.float64))
        self.c = nn.Parameter(torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        return torch.tanh(x.flatten(1) @ self.W.T) @ self.v + self.c

    def input_gradient(self, x):
        h = torch.tanh(x.flatten(1) @ self.W.T)
        return ((1 - h ** 2) * self.v) @ self.W


class Augmented(nn.Module):
    """D after a fixed augmentation (given draws): what ``ctx.discriminate`` will call with augmentation on."""

    def __init__(self, augment: AdaAugment, draws: AdaDraws, D: nn.Module) -> None:
        super().__init__()
        self.augment, self.draws, self.D = augment, draws, D

    def forward(self, x):
        return self.D(self.augment.apply(x, self.draws))


def test_r1_through_an_augmentation_is_the_gradient_carried_back_to_the_unaugmented_image():
    """R1 = gamma/2 E|d D(A(x)) / dx|^2 with A = reflected shift, flip and contrast c: by hand,
    d/dx = c * P^T g(A(x)), P the pixel-copy matrix built with numpy (reflection copies some pixels
    twice, so P^T is not a permutation and the norm is not preserved)."""
    n, size = 2, 5
    x = torch.rand(n, 1, size, size, dtype=torch.float64) * 2 - 1
    D = TanhD(size * size)
    contrast = torch.tensor([1.5, 0.5])
    colour = color_transform(torch.zeros(n), contrast, torch.zeros(n, dtype=torch.bool), torch.zeros(n), torch.ones(n))
    draws = AdaDraws(torch.tensor([True, False]), torch.tensor([0, 0]), torch.tensor([[2, 0], [-1, 2]]), None, None,
                     colour, torch.tensor([True, True]))
    ctx = StepContext({"G": nn.Identity(), "D": Augmented(AdaAugment(p=1.0), draws, D)})
    ctx.phase, ctx.micro = Phase("R1", "D", lambda c: None), MicroBatch(x, None, None, None)
    penalty = r1_penalty(gamma=4.0)(ctx)

    expected = []
    for i in range(n):
        index = np.arange(size * size).reshape(1, size, size)
        if draws.flip[i]:
            index = index[:, :, ::-1]
        index = numpy_shift(np.ascontiguousarray(index), *draws.shift[i].tolist(), mode="reflect")
        P = np.zeros((size * size, size * size))
        P[np.arange(size * size), index.reshape(-1)] = 1  # augmented pixel k copies input pixel index[k]
        y = contrast[i].item() * (P @ x[i].reshape(-1).numpy())
        g = D.input_gradient(torch.from_numpy(y).view(1, -1))[0].detach().numpy()
        expected.append(contrast[i].item() * P.T @ g)
    by_hand = 4.0 / 2 * np.mean([np.sum(e ** 2) for e in expected])
    assert penalty.item() == pytest.approx(by_hand, rel=1e-12)
    penalty.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in D.parameters())


# -- the adaptive probability ------------------------------------------------------------------------------
def test_p_moves_by_the_images_of_the_interval_towards_the_target():
    augment = AdaAugment()
    control = AdaptiveP(augment, target=0.6, interval=2, ada_kimg=0.5)  # 500 images from 0 to 1
    confident = torch.tensor([3.0, 1.0, 2.0, -1.0, 4.0])  # signs sum to 3
    control.observe(torch.full((8,), 2.0))  # all positive
    assert not control.tick() and control.p == 0.0
    control.observe(torch.full((8,), 1.0))
    assert control.tick()
    assert control.rt == 1.0 and control.p == 16 / 500 and augment.p == control.p
    control.observe(confident)
    control.tick()
    control.observe(torch.tensor([-1.0, -2.0, 0.0]))  # r_t = (4 - 1 - 2) / 8 = 0.125 < 0.6: down
    control.tick()
    assert control.rt == pytest.approx(1 / 8) and control.p == pytest.approx(16 / 500 - 8 / 500, abs=1e-15)
    control.observe(torch.full((6,), 1.0))
    control.observe(torch.tensor([-1.0, -1.0, -1.0, -1.0]))  # r_t = 0.2: down, clamped at 0
    control.tick()
    control.tick()
    assert control.p == 0.0 and augment.p == 0.0


def test_p_is_clamped_below_p_max_and_an_interval_without_logits_keeps_p():
    control = AdaptiveP(target=0.6, interval=1, ada_kimg=0.001, p=0.5, p_max=0.9)
    control.observe(torch.ones(10))
    control.tick()
    assert control.p == 0.9
    control.tick()
    assert control.p == 0.9 and control.rt == 1.0 and control.updates == 2


def test_the_reduce_hook_gets_the_interval_statistic_and_its_result_moves_p():
    seen = []

    def reduce(t):  # as if another process had seen 10 logits, all negative
        seen.append(t.clone())
        return t + torch.tensor([-10, 10])

    control = AdaptiveP(interval=1, ada_kimg=1.0, reduce=reduce)
    control.p = 0.5
    control.observe(torch.tensor([1.0, 2.0, -3.0, float("nan")]))
    control.tick()
    assert [t.tolist() for t in seen] == [[1, 3]]  # (sum of signs, count): a NaN logit counts as nothing
    assert control.rt == -9 / 13 and control.p == 0.5 - 13 / 1000


def test_two_processes_end_with_the_same_p_as_one_that_saw_both_batches():
    """Two controllers whose reduce is a real sum over two threads (an all-reduce): same p on both, equal to
    one controller observing both halves, after several intervals that move p both ways."""
    rng = torch.Generator().manual_seed(0)
    halves = [[torch.randn(6, generator=rng) + shift for _ in range(2)] for shift in (2, 2, -1, 2, 0.3, -2)]
    barrier, slots = threading.Barrier(2), [None, None]

    def make_reduce(rank):
        def reduce(t):
            slots[rank] = t.clone()
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()
            return total
        return reduce

    controls = [AdaptiveP(interval=2, ada_kimg=0.05, reduce=make_reduce(r)) for r in range(2)]
    ps = [[], []]

    def run(rank):
        for step, (first, second) in enumerate(halves):
            controls[rank].observe((first, second)[rank])
            if controls[rank].tick():
                ps[rank].append(controls[rank].p)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    single = AdaptiveP(interval=2, ada_kimg=0.05)
    expected = []
    for first, second in halves:
        single.observe(torch.cat([first, second]))
        if single.tick():
            expected.append(single.p)
    assert ps[0] == ps[1] == expected
    assert expected[0] > 0 and min(expected) < max(expected)  # p went up, then down


def test_controller_state_round_trips_mid_interval():
    a = AdaptiveP(interval=3, ada_kimg=0.1, p=0.25)
    a.observe(torch.tensor([1.0, -1.0, 2.0]))
    a.tick()
    a.observe(torch.tensor([1.0]))
    a.tick()
    state = a.state_dict()
    b = AdaptiveP(interval=3, ada_kimg=0.1)
    b.load_state_dict(state)
    assert b.state_dict() == state
    for control in (a, b):
        control.observe(torch.tensor([3.0, 3.0]))
        control.tick()
    assert a.p == b.p and a.rt == b.rt and a.state_dict() == b.state_dict()
    c = AdaptiveP(AdaAugment(), interval=3)
    c.load_state_dict({**state, "p": torch.tensor(0.123456789, dtype=torch.float64)})
    assert c.p == 0.123456789 and c.augment.p == c.p


def overfitting_probe(overfits: bool) -> float:
    """p after 24 D updates (6 adjustments of 0.05, from 0.5) on 16 fixed real samples.

    ``overfits``: the fakes are a collapsed G's (small noise), which D soon separates: D(real) > 0 for every
    real, r_t -> 1. Otherwise the fakes are the reals themselves (jittered): D cannot be confident, r_t ~ 0.
    """
    torch.manual_seed(0)
    reals = torch.randn(16, 8)
    D = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(D.parameters(), lr=1e-2)
    control = AdaptiveP(interval=4, ada_kimg=1.28, p=0.5)  # 4 x 16 images / 1280 = 0.05 per adjustment
    for _ in range(24):
        real_logits = D(reals).squeeze(1)
        fakes = 0.2 * torch.randn(16, 8) if overfits else reals[torch.randperm(16)] + 0.01 * torch.randn(16, 8)
        loss = nn.functional.softplus(-real_logits).mean() + nn.functional.softplus(D(fakes)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        control.observe(real_logits)
        control.tick()
    return control.p


def test_p_rises_on_a_discriminator_that_overfits_and_falls_on_one_that_does_not():
    assert overfitting_probe(overfits=True) >= 0.5 + 0.15  # at least 5 of 6 adjustments up
    assert overfitting_probe(overfits=False) <= 0.5 - 0.15  # at least 5 of 6 down
