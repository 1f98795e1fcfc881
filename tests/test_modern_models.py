"""The r3gan family: shapes, conditioning, fix-up initialisation, the double backward, and the engine's proofs."""

from __future__ import annotations

import pytest
import torch

from conftest import Z_DIM, assert_close_dicts, params
from gan_accel.models import build_models, default_spec
from gan_accel.models.r3gan import Block
from gan_accel.objectives.regularizers import r1_penalty
from test_phases import context_for
from test_rpgan import make_trainer, plain_rpgan_loop

pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")


def tiny(seed: int = 0, size: int = 28, num_classes=None, **overrides):
    """A float64 r3gan pair of width 2 with one block per scale, for MNIST-sized grey images."""
    torch.manual_seed(seed)
    spec = default_spec("r3gan", size, channels=1, num_classes=num_classes, **{"width": 2, "blocks": 1, "z_dim": Z_DIM,
                                                                             **overrides})
    G, D = build_models(spec)
    return G.double(), D.double()


def images(n: int, size: int = 28, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 - 1


@pytest.mark.parametrize("size", [28, 32, 64, 128])
def test_shapes_at_each_resolution_unconditional_and_conditional(size):
    G, D = tiny(size=size)
    x = G(torch.randn(3, Z_DIM, dtype=torch.float64))
    assert x.shape == (3, 1, size, size) and D(x).shape == (3,)
    G, D = tiny(size=size, num_classes=5)
    y = torch.tensor([0, 4, 2])
    x = G(torch.randn(3, Z_DIM, dtype=torch.float64), y)
    assert x.shape == (3, 1, size, size)
    every = D(x, y, all_classes=True)
    assert every.shape == (3, 5)
    torch.testing.assert_close(every.gather(1, y[:, None]).squeeze(1), D(x, y), atol=1e-12, rtol=0)
    assert not torch.allclose(D(x, y), D(x, y.roll(1)))  # the label changes the judgement
    assert not torch.allclose(G(torch.zeros(3, Z_DIM, dtype=torch.float64), y)[0],
                              G(torch.zeros(3, Z_DIM, dtype=torch.float64), y)[1])


def test_fixup_makes_every_block_the_identity_at_initialisation():
    G, D = tiny(size=32, width=8, blocks=2)  # 32 channels wide: grouped 3x3 convs
    blocks = [m for m in [*G.modules(), *D.modules()] if isinstance(m, Block)]
    assert len(blocks) == 2 * 2 * 4 and any(b.mix.groups > 1 for b in blocks)
    for block in blocks:
        x = torch.randn(2, block.expand.in_channels, 4, 4, dtype=torch.float64)
        assert torch.equal(block(x), x)
        assert block.expand.weight.std() > 0 and block.mix.weight.std() > 0  # only the last conv is zero


def test_bf16_autocast_and_channels_last_run_on_cpu():
    G, D = tiny(size=32, width=8)
    G, D = G.float().to(memory_format=torch.channels_last), D.float().to(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = D(G(torch.randn(2, Z_DIM)))
    assert logits.shape == (2,) and torch.isfinite(logits.float()).all()


def test_r1_double_backward_through_D_matches_finite_differences():
    """R1's parameter gradient (a double backward through every block) against central differences."""
    _, D = tiny()
    with torch.no_grad():  # away from the fix-up start, so every weight matters
        for p in D.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    real = images(3)
    penalty = lambda: r1_penalty(2.0)(context_for(D, real))  # noqa: E731
    penalty().backward()
    probes = [D.stages[0][0].expand.weight, D.stages[0][0].mix.weight, D.stages[0][0].project.weight,
              D.from_image.weight, D.basis.weight, D.head.weight]
    for p in probes:
        index, eps = (0,) * p.dim(), 1e-6
        p.data[index] += eps  # .data: the penalty itself needs autograd on
        up = penalty().item()
        p.data[index] -= 2 * eps
        down = penalty().item()
        p.data[index] += eps
        assert abs(p.grad[index].item()) > 1e-4 and p.grad[index].item() == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9)


def test_accumulation_equals_larger_batch_with_rpgan_r1_r2(tmp_path):
    b, k, steps = 2, 2, 3
    data = images(k * b * steps * 2)
    small = make_trainer(tmp_path / "small", data, b, steps, models=tiny, grad_accum_steps=k)
    small.fit()
    big = make_trainer(tmp_path / "big", data, k * b, steps, models=tiny)
    big.fit()
    assert_close_dicts(params(small.G), params(big.G), atol=1e-10)
    assert_close_dicts(params(small.D), params(big.D), atol=1e-10)


def test_engine_matches_a_plain_pytorch_loop(tmp_path):
    steps, b = 3, 4
    data = images(steps * b)
    trainer = make_trainer(tmp_path / "run", data, b, steps, models=tiny)
    trainer.fit()
    twin_G, twin_D = plain_rpgan_loop(data, b, steps, models=tiny)
    assert_close_dicts(params(trainer.G), twin_G, atol=1e-10)
    assert_close_dicts(params(trainer.D), twin_D, atol=1e-10)
    G0, _ = tiny()
    assert all(not torch.equal(v, params(G0)[k]) for k, v in twin_G.items()), "every weight of G should have moved"
