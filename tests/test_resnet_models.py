"""The residual family, its spectral normalisation, and the model registry: shapes, contracts, the engine's
proofs (accumulation = larger batch, engine = plain loop) with these models, and the speed benchmark's shape."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import TableLabels, TableLatents, assert_close_dicts, make_loader, params, reset_accelerate_state
from gan_accel import ConfigError, GANTrainer, TrainConfig
from gan_accel.engine.schedules import warmup_then_decay
from gan_accel.models import (ResNetDiscriminator, ResNetGenerator, build_generator, build_models, default_spec,
                              normalize_spec, supported_resolutions)
from gan_accel.models.resnet import CHANNELS
from gan_accel.models.spectral import SpectralNormMixin

pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
SIZES = (28, 32, 64, 128, 256)


def tiny(size: int, channels: int = 3, num_classes: int | None = None, width: int = 1, z_dim: int = 8,
         norm: str = "batch", dtype=torch.float32) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    G = ResNetGenerator(z_dim=z_dim, width=width, image_size=size, channels=channels, num_classes=num_classes,
                        norm=norm)
    D = ResNetDiscriminator(width=width, image_size=size, channels=channels, num_classes=num_classes)
    return G.to(dtype), D.to(dtype)


# -- shapes, ranges, contracts ------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("channels, num_classes", [(1, None), (3, None), (1, 4), (3, 4)])
def test_every_size_makes_images_in_range_and_one_logit_each(size, channels, num_classes):
    G, D = tiny(size, channels, num_classes)
    z, y = torch.randn(3, 8), torch.tensor([0, 3, 1])
    labels = () if num_classes is None else (y,)
    x = G(z, *labels)
    assert x.shape == (3, channels, size, size)
    assert x.abs().max() <= 1 and x.std() > 0
    logits = D(x, *labels)
    assert logits.shape == (3,) and torch.isfinite(logits).all()


@pytest.mark.parametrize("size", SIZES)
def test_depth_and_width_follow_the_resolution_table(size):
    width = 2
    G, D = tiny(size, width=width)
    multipliers = CHANNELS[size]
    assert len(G.blocks) == len(multipliers) - 1 and G.base * 2 ** len(G.blocks) == size
    assert [b.conv1.out_channels for b in G.blocks] == [width * m for m in multipliers[1:]]
    assert G.linear.out_features == width * multipliers[0] * G.base ** 2
    # D: the mirror image, at half G's channels per scale, plus one block at the base grid
    assert [b.conv1.out_channels for b in D.blocks] == [width * m for m in reversed(multipliers)]
    assert [b.down for b in D.blocks] == [True] * (len(multipliers) - 1) + [False]
    shapes = []
    h = torch.zeros(1, 3, size, size)
    for block in D.blocks:
        h = block(h)
        shapes.append(h.shape[-1])
    assert shapes == [size >> k for k in range(1, len(multipliers))] + [G.base]


def test_projection_contract_column_y_is_the_plain_logit_and_labels_matter():
    G, D = tiny(32, num_classes=5, dtype=torch.float64)
    x, y = torch.rand(6, 3, 32, 32, dtype=torch.float64) * 2 - 1, torch.tensor([0, 1, 2, 3, 4, 0])
    plain, every = D(x, y), D(x, y, all_classes=True)
    assert every.shape == (6, 5)
    torch.testing.assert_close(every.gather(1, y.view(-1, 1)).squeeze(1), plain, atol=1e-12, rtol=0)
    assert (D(x, (y + 1) % 5) - plain).abs().min() > 0, "a label paired with another image must change its logit"
    # h @ E^T by hand: the projection term of class k is <E_k, h>
    h = D.features(x)
    by_hand = D.psi(h) + torch.stack([(D.embed.normalized_weight()[k] * h).sum(1) for k in range(5)], 1)
    torch.testing.assert_close(every, by_hand, atol=1e-12, rtol=0)


def test_an_unsupported_size_is_refused_by_both_constructors():
    for build in (lambda: ResNetGenerator(image_size=48), lambda: ResNetDiscriminator(image_size=48)):
        with pytest.raises(ValueError, match="image_size=48 is not supported .* choose one of 28, 32, 64, 128, 256"):
            build()


def test_labels_must_match_the_model():
    G, D = tiny(32)
    with pytest.raises(TypeError, match="unconditional"):
        G(torch.randn(2, 8), torch.tensor([0, 1]))
    Gc, Dc = tiny(32, num_classes=3)
    with pytest.raises(TypeError, match="num_classes=3: call it with labels"):
        Dc(torch.zeros(2, 3, 32, 32))


def test_conditional_batchnorm_gain_and_bias_come_from_the_class():
    G, _ = tiny(32, num_classes=3)
    norm = G.blocks[0].norm1
    with torch.no_grad():
        norm.gain.weight[1].fill_(2.0)
        norm.bias.weight[1].fill_(0.5)
    x = torch.randn(4, norm.bn.num_features, 4, 4)
    out = norm(x, torch.tensor([0, 1, 0, 1]))
    normalised = F.batch_norm(x, None, None, training=True)
    torch.testing.assert_close(out[[0, 2]], normalised[[0, 2]], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[[1, 3]], 2 * normalised[[1, 3]] + 0.5, atol=1e-5, rtol=0)


# -- spectral normalisation -----------------------------------------------------------------------------
def sn_layers(D: nn.Module) -> list[SpectralNormMixin]:
    return [m for m in D.modules() if isinstance(m, SpectralNormMixin)]


def test_every_weight_of_D_is_spectrally_normalised_to_norm_one():
    _, D = tiny(64, num_classes=3, width=2, dtype=torch.float64)
    weighted = [m for m in D.modules() if isinstance(m, (nn.Conv2d, nn.Linear, nn.Embedding))]
    assert weighted and all(isinstance(m, SpectralNormMixin) for m in weighted)
    for layer in weighted:
        sigma_max = torch.linalg.matrix_norm(layer.normalized_weight().detach().flatten(1), ord=2)
        assert sigma_max.item() == pytest.approx(1.0, abs=0.05), layer


def one_iteration(layer: SpectralNormMixin, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The power iteration written out: v = W^T u / |W^T u|, u' = W v / |W v|."""
    w = layer.weight.detach().flatten(1)
    v = w.t() @ u
    v = v / v.norm()
    u = w @ v
    return u / u.norm(), v


def estimates(D: nn.Module) -> list[torch.Tensor]:
    return [t.clone() for layer in sn_layers(D) for t in (layer.sn_u, layer.sn_v)]


def test_one_power_iteration_per_weight_update_whatever_the_number_of_forwards():
    _, D = tiny(28, channels=1, width=2, dtype=torch.float64)
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    opt = torch.optim.Adam(D.parameters(), lr=1e-2, fused=True)  # a fused step leaves version counters alone
    before = estimates(D)
    for _ in range(3):
        D(x)
    assert all(torch.equal(a, b) for a, b in zip(before, estimates(D))), "no update, no power iteration"
    for micro in x.split(2):  # two accumulated micro-batches, then one step
        D(micro).sum().backward()
    opt.step()
    expected = [t for layer in sn_layers(D) for t in one_iteration(layer, layer.sn_u)]
    D(x)
    D(x)
    for got, want in zip(estimates(D), expected):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    D.eval()
    opt.step()
    after_one = estimates(D)
    D(x)
    assert all(torch.equal(a, b) for a, b in zip(after_one, estimates(D))), "eval mode uses the stored estimate"
    D.train()
    D(x)
    assert not torch.equal(after_one[1], estimates(D)[1]), "the next training forward refreshes"


@pytest.mark.parametrize("saved_after", ["step", "forward"])
def test_a_loaded_D_does_the_same_power_iterations_as_the_original(saved_after):
    """Resume: saved right after a step (estimate stale) or after the next forward (fresh), the copy then
    trains bit for bit like the original."""
    _, D = tiny(28, channels=1, width=2, dtype=torch.float64)
    opt = torch.optim.Adam(D.parameters(), lr=1e-2, fused=True)
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    D(x).sum().backward()
    opt.step()
    if saved_after == "forward":
        D(x)
    state, opt_state = copy.deepcopy(D.state_dict()), copy.deepcopy(opt.state_dict())
    assert bool(state["blocks.0.conv1.sn_fresh"]) == (saved_after == "forward")
    _, resumed = tiny(28, channels=1, width=2, dtype=torch.float64)
    resumed.load_state_dict(state)
    opt2 = torch.optim.Adam(resumed.parameters(), lr=1e-2, fused=True)
    opt2.load_state_dict(opt_state)
    for net, optimizer in ((D, opt), (resumed, opt2)):
        for _ in range(2):
            optimizer.zero_grad()
            net(x).square().mean().backward()
            optimizer.step()
        net(x)
    assert_close_dicts(params(D), params(resumed), atol=0)


def test_r1_double_backward_through_D_matches_a_finite_difference():
    """R1's parameter gradient (a double backward through spectral norm and every block) against a central
    difference, parameter by parameter along a random direction; eval mode so the perturbed weights keep the
    same u, v. Zero exactly where the maths makes it zero, nonzero everywhere else."""
    _, D = tiny(28, channels=1, num_classes=3, width=1, dtype=torch.float64)
    D.eval()
    x, y = torch.rand(3, 1, 28, 28, dtype=torch.float64) * 2 - 1, torch.tensor([0, 2, 1])

    def r1() -> torch.Tensor:
        inp = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(D(inp, y).sum(), inp, create_graph=True)
        return grad.square().sum() / 2

    D.zero_grad()
    r1().backward()
    grads = {name: torch.zeros_like(p) if p.grad is None else p.grad for name, p in D.named_parameters()}
    total = torch.cat([g.flatten() for g in grads.values()]).norm()
    # What the maths makes zero, whatever the rounding: a bias reaches the input gradient only through the
    # LeakyReLU masks (piecewise constant), and spectral norm makes a weight scale-invariant (W / u^T W v), so
    # a one-element weight (the first block's 1x1 skip at width 1) is a constant +-1: no gradient at all.
    zero = {name for name, p in D.named_parameters() if p.dim() == 1 or p.numel() == 1}
    assert "blocks.0.skip.weight" in zero
    eps = 1e-6
    for name, p in D.named_parameters():
        direction = torch.randn_like(p)
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                p.add_(sign * eps * direction)
            values.append(r1().item())
            with torch.no_grad():
                p.sub_(sign * eps * direction)
        finite, analytic = (values[0] - values[1]) / (2 * eps), (grads[name] * direction).sum().item()
        # float64 noise of the difference: about |r1| * 1e-16 / eps; the analytic zero is zero up to rounding
        assert analytic == pytest.approx(finite, rel=1e-5, abs=1e-8), name
        if name in zero:
            assert grads[name].norm() <= 1e-12 * total, f"{name}: the maths makes this gradient zero"
        else:
            assert grads[name].norm() > 1e-4 * total, f"{name} shapes the input gradient"
    for name, module in D.named_modules():  # scale invariance: every normalised weight's gradient is orthogonal to it
        if isinstance(module, SpectralNormMixin):
            w, g = module.weight, grads[f"{name}.weight"]
            assert (g * w).sum().abs() <= 1e-9 * g.norm() * w.norm() + 1e-12 * total, name


# -- precision, memory format, compile ------------------------------------------------------------------------
def test_bf16_autocast_forward_and_backward():
    G, D = tiny(32, num_classes=3, width=2)
    conv_dtypes = []
    D.blocks[1].conv1.register_forward_hook(lambda m, i, o: conv_dtypes.append(o.dtype))
    y = torch.tensor([0, 1, 2, 0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = D(G(torch.randn(4, 8), y), y)
        sigma = D.blocks[1].conv1.sigma()
    assert conv_dtypes == [torch.bfloat16]
    assert sigma.dtype == torch.float32, "sigma must not be estimated in bf16"
    F.softplus(-logits.float()).mean().backward()
    for net in (G, D):
        grads = [p.grad for p in net.parameters() if p.requires_grad]
        assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_channels_last_gives_the_same_images_logits_and_gradients():
    G, D = tiny(64, width=2)
    G2, D2 = copy.deepcopy(G), copy.deepcopy(D)
    G2.to(memory_format=torch.channels_last)
    D2.to(memory_format=torch.channels_last)
    z = torch.randn(3, 8)
    for g, d in ((G, D), (G2, D2)):
        d(g(z)).sum().backward()
    x2 = G2(z)
    assert x2.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(x2, G(z), atol=1e-5, rtol=1e-4)
    for a, b in zip([*G.parameters(), *D.parameters()], [*G2.parameters(), *D2.parameters()]):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-3)


@pytest.mark.slow  # dynamo tracing: ~50 s on a busy 2-core machine (inductor's code generation: ~5 min there)
def test_compiled_models_match_eager_and_still_refresh_spectral_norm():
    """Traced by dynamo and AOT autograd (``aot_eager``: where graph breaks, hooks and autograd of the traced
    graph are decided; inductor only generates the kernels, and passed the same check once, in 301 s)."""
    G, D = tiny(32, num_classes=3, width=2, dtype=torch.float64)
    y, z = torch.tensor([0, 1, 2, 1]), torch.randn(4, 8, dtype=torch.float64)
    cG, cD = torch.compile(G, backend="aot_eager"), torch.compile(D, backend="aot_eager")
    torch.testing.assert_close(cD(cG(z, y), y), D(G(z, y), y), atol=1e-10, rtol=0)
    cD(cG(z, y), y).sum().backward()
    compiled_grads = [p.grad.clone() for p in [*G.parameters(), *D.parameters()]]
    G.zero_grad()
    D.zero_grad()
    D(G(z, y), y).sum().backward()
    for a, b in zip(compiled_grads, [p.grad for p in [*G.parameters(), *D.parameters()]]):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    torch.optim.SGD(D.parameters(), lr=0.1).step()
    expected = [t for layer in sn_layers(D) for t in one_iteration(layer, layer.sn_u)]
    cD(cG(z, y), y)
    for got, want in zip(estimates(D), expected):  # the compiled D ran the refresh hook
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


# -- the engine's proofs with these models ------------------------------------------------------------------
def resnet_trainer(tmp_path, batch, accum, steps, images, labels=None, latents=None, fake_labels=None,
                   norm="batch") -> GANTrainer:
    num_classes = 3 if labels is not None else None
    # width 2: at width 1 D's first skip weight is one number, which spectral norm turns into a constant +-1, so its
    # gradient is zero and Adam (step ~ gradient / eps) turns its rounding noise into updates of ~1e-10
    G, D = tiny(28, channels=1, num_classes=num_classes, width=2, z_dim=4, norm=norm, dtype=torch.float64)
    latents = latents or TableLatents(4096)
    config = TrainConfig(max_steps=steps, batch_size=batch, grad_accum_steps=accum, z_dim=4, log_every=1,
                         sample_every=1000, num_samples=4, output_dir=str(tmp_path), progress_bar=False,
                         warmup_ratio=0.0, lr_G=1e-2, lr_D=1e-2, num_classes=num_classes)
    trainer = GANTrainer(G, D, make_loader(images, batch, labels), config, latent_sampler=latents,
                         label_sampler=fake_labels)
    latents.rewind()
    if fake_labels is not None:
        fake_labels.rewind()
    return trainer


def test_accumulation_equals_a_larger_batch_with_the_residual_models(tmp_path):
    """k=2 micro-batches of 3 == one batch of 6, with spectral norm in D (one power iteration per update)
    and G without BatchNorm (norm="none": BatchNorm statistics would differ between the batch sizes)."""
    images = torch.rand(24, 1, 28, 28, dtype=torch.float64) * 2 - 1
    small = resnet_trainer(tmp_path / "small", 3, 2, 3, images, norm="none")
    small.fit()
    small_G, small_D = params(small.G), params(small.D)
    reset_accelerate_state()
    big = resnet_trainer(tmp_path / "big", 6, 1, 3, images, norm="none")
    big.fit()
    assert_close_dicts(small_G, params(big.G), atol=1e-10)
    assert_close_dicts(small_D, params(big.D), atol=1e-10)
    initial = tiny(28, 1, width=2, dtype=torch.float64)[1].state_dict()
    assert not torch.equal(small_D["blocks.1.conv1.sn_v"], initial["blocks.1.conv1.sn_v"]), "the estimates moved"


def plain_loop(images, labels, batch, steps, latents, fake_labels) -> tuple[dict, dict]:
    """The textbook conditional loop with the same models: D on reals and detached fakes, then G through frozen D."""
    G, D = tiny(28, channels=1, num_classes=3, width=2, z_dim=4, dtype=torch.float64)
    opt_G = torch.optim.Adam(G.parameters(), lr=1e-2, betas=(0.5, 0.999), fused=True)
    opt_D = torch.optim.Adam(D.parameters(), lr=1e-2, betas=(0.5, 0.999), fused=True)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, warmup_then_decay(steps, 0, "linear")) for o in (opt_G, opt_D)]
    for step in range(steps):
        real, y_real = images[step * batch:(step + 1) * batch], labels[step * batch:(step + 1) * batch]
        y_fake = fake_labels(batch, torch.device("cpu"))
        fake = G(latents(batch, torch.device("cpu")), y_fake)
        opt_D.zero_grad()
        (F.softplus(-D(real, y_real)).mean() + F.softplus(D(fake.detach(), y_fake)).mean()).backward()
        opt_D.step()
        scheds[1].step()
        opt_G.zero_grad()
        D.requires_grad_(False)
        F.softplus(-D(fake, y_fake)).mean().backward()
        D.requires_grad_(True)
        opt_G.step()
        scheds[0].step()
    return params(G), params(D)


def test_the_engine_matches_a_plain_loop_with_the_conditional_residual_models(tmp_path):
    """BatchNorm'd conditional G, projection D with spectral norm: the engine's run is the textbook loop's."""
    steps, batch = 4, 4
    images = torch.rand(steps * batch, 1, 28, 28, dtype=torch.float64) * 2 - 1
    labels = torch.randint(3, (steps * batch,), generator=torch.Generator().manual_seed(2))
    trainer = resnet_trainer(tmp_path, batch, 1, steps, images, labels=labels, fake_labels=TableLabels())
    trainer.fit()
    twin_G, twin_D = plain_loop(images, labels, batch, steps, TableLatents(4096), TableLabels())
    assert_close_dicts(params(trainer.G), twin_G, atol=1e-12)
    assert_close_dicts(params(trainer.D), twin_D, atol=1e-12)


# -- the registry ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["dcgan", "resnet"])
def test_every_default_spec_builds_models_of_its_size_and_survives_json(family):
    for size in supported_resolutions(family):
        for num_classes in (None, 3):
            spec = default_spec(family, size, channels=1, num_classes=num_classes, width=2, z_dim=8)
            assert json.loads(json.dumps(spec)) == spec and spec == normalize_spec(spec)
            torch.manual_seed(0)
            G, D = build_models(json.loads(json.dumps(spec)))
            torch.manual_seed(0)
            alone = build_generator(spec)
            assert_close_dicts(params(G), params(alone), atol=0)
            labels = () if num_classes is None else (torch.tensor([0, 2]),)
            x = G.eval()(torch.randn(2, 8), *labels)
            assert x.shape == (2, 1, size, size)
            assert D(x, *labels).shape == (2,)



@pytest.mark.parametrize("spec, message", [
    (dict(family="dcgan", image_size=128),
     "the dcgan family makes 28, 32 or 64 px images, not 128: use --model resnet for 128 px$"),
    (dict(family="resnet", image_size=48), "the resnet family makes 28, 32, 64, 128 or 256 px images, not 48$"),
    (dict(family="stylegan"), "unknown model family 'stylegan': choose one of dcgan, resnet"),
    (dict(family="resnet", depth=3), "unknown key.*depth in a resnet model spec"),
    (dict(family="resnet", width=0), "width=0 in the resnet model spec must be an integer >= 1"),
    (dict(family="resnet", norm="layer"), "norm='layer' is not a normalisation of G"),
    (dict(family="dcgan", class_stddev=True), "leave it out"),
    (dict(family="dcgan", d_position="corners"), "d_position='corners': choose one of coords, moments, profiles"),
])
def test_specs_a_family_cannot_build_are_refused_in_one_line(spec, message):
    full = {"family": "resnet", "z_dim": 8, "width": 2, "image_size": 32, "channels": 3, "num_classes": None, **spec}
    with pytest.raises(ConfigError, match=message) as info:
        build_models(full)
    assert "\n" not in str(info.value)


# -- the benchmark runs -------------------------------------------------------------------------------------
def test_model_speed_quick_prints_a_row_per_family_and_size(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import model_speed
    finally:
        sys.path.pop(0)
    model_speed.main(["--quick", "--sizes", "32", "128", "--width", "2", "--batch", "2", "--threads", "1"])
    out = capsys.readouterr().out
    assert "| --- |" in out and "images/s" in out
    assert "| dcgan | 128 | - |" in out and "not made by this family" in out
    for family in ("dcgan", "resnet"):
        assert f"| {family} | 32 | 2 |" in out
    assert "| resnet | 128 | 2 |" in out
