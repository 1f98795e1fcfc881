"""The EMA of G: StyleGAN2's half-life in images with its ramp-up, and BatchNorm statistics measured
for the averaged weights; each checked against a hand computation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gan_accel.callbacks.ema import EMA


def scalar_module(value: float) -> nn.Module:
    module = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(value)
    return module


def weight(module: nn.Module) -> float:
    return float(module.weight.detach().reshape(()))


def test_half_life_update_is_the_closed_form():
    G = scalar_module(0.0)
    ema = EMA(G, decay=None, half_life_images=1000)
    with torch.no_grad():
        G.weight.fill_(1.0)
    ema.update(G, images_per_update=250)
    beta = 0.5 ** (250 / 1000)  # by hand: the old average keeps beta of its weight
    assert weight(ema.module) == pytest.approx(beta * 0.0 + (1 - beta) * 1.0, abs=1e-7)


@pytest.mark.parametrize("batch", [10, 25, 100])
def test_half_life_means_the_same_whatever_the_batch(batch):
    """G jumps from 0 to 1; after exactly one half-life of images the average is at 0.5, at any batch size."""
    G = scalar_module(0.0)
    ema = EMA(G, decay=None, half_life_images=500)
    with torch.no_grad():
        G.weight.fill_(1.0)
    for _ in range(500 // batch):
        ema.update(G, images_per_update=batch)
    assert weight(ema.module) == pytest.approx(0.5, abs=1e-6)


def test_rampup_starts_as_a_copy_and_caps_the_half_life():
    G = scalar_module(3.0)
    ema = EMA(scalar_module(-5.0), decay=None, half_life_images=10_000, rampup=0.5)
    ema.update(G, images_per_update=100)  # nothing seen before: beta = 0, the average is G
    assert weight(ema.module) == pytest.approx(3.0)
    with torch.no_grad():
        G.weight.fill_(7.0)
    ema.update(G, images_per_update=100)  # half-life min(10000, 0.5 * 100) = 50 images
    beta = 0.5 ** (100 / 50)
    assert weight(ema.module) == pytest.approx(beta * 3.0 + (1 - beta) * 7.0, abs=1e-6)
    assert ema.images_seen == 200


def test_per_step_decay_keeps_its_warmup():
    G = scalar_module(1.0)
    ema = EMA(scalar_module(0.0), decay=0.99)
    ema.update(G)  # first update: min(0.99, 1/10)
    assert weight(ema.module) == pytest.approx(0.9, abs=1e-7)


class BNGenerator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, z):
        return self.bn(self.fc(z))


def test_recomputed_batchnorm_statistics_are_those_of_the_averaged_weights():
    torch.manual_seed(0)
    G = BNGenerator()
    ema = EMA(G, decay=None, half_life_images=10, batchnorm="recompute")
    for _ in range(3):  # move G (weights and its own running statistics) so the average differs
        with torch.no_grad():
            G.fc.weight.add_(torch.randn_like(G.fc.weight))
        G.train()
        G(torch.randn(16, 3))
        ema.update(G, images_per_update=16)
    assert ema.stale
    batches = [torch.randn(32, 3, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    ema.recompute_batchnorm([lambda m, z=z: m(z) for z in batches])
    assert not ema.stale and not ema.module.training
    # Independent: the averaged linear layer's outputs, their per-batch means and unbiased variances, averaged.
    with torch.no_grad():
        outs = [ema.module.fc(z) for z in batches]
    expected_mean = torch.stack([o.mean(0) for o in outs]).mean(0)
    expected_var = torch.stack([o.var(0, unbiased=True) for o in outs]).mean(0)
    assert torch.allclose(ema.module.bn.running_mean, expected_mean, atol=1e-6)
    assert torch.allclose(ema.module.bn.running_var, expected_var, atol=1e-5)
    assert ema.module.bn.momentum == 0.1  # put back
    # And not G's statistics, which "copy" would have taken.
    assert not torch.allclose(ema.module.bn.running_mean, G.bn.running_mean)


def test_copy_mode_takes_the_generators_buffers():
    G = BNGenerator()
    ema = EMA(G, decay=0.5, batchnorm="copy")
    G.train()
    G(torch.randn(8, 3))
    ema.update(G)
    assert torch.equal(ema.module.bn.running_mean, G.bn.running_mean)


@pytest.mark.parametrize("kwargs, match", [
    ({"decay": 0.9, "half_life_images": 10}, "either decay or half_life_images"),
    ({"decay": None}, "either decay or half_life_images"),
    ({"decay": None, "half_life_images": -1}, "half_life_images must be > 0"),
    ({"decay": None, "half_life_images": 5, "rampup": 0}, "rampup must be > 0"),
    ({"decay": 0.9, "batchnorm": "mean"}, "batchnorm='mean' is invalid"),
])
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EMA(scalar_module(0.0), **kwargs)


def test_config_checks_the_ema_options():
    from gan_accel import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="ema_decay and ema_half_life are both set"):
        TrainConfig(ema_decay=0.9, ema_half_life=1000)
    with pytest.raises(ConfigError, match="ema_rampup needs ema_half_life"):
        TrainConfig(ema_rampup=0.05)
    with pytest.raises(ConfigError, match="ema_batchnorm='x' is invalid"):
        TrainConfig(ema_batchnorm="x")


def test_trainer_ema_follows_the_half_life_formula_over_the_real_run(tmp_path):
    """The trainer's EMA, against the average computed by hand from G's weights after every step."""
    import copy

    from torch.utils.data import DataLoader, TensorDataset

    from gan_accel import Callback, GANTrainer, TrainConfig
    from gan_accel.models import DCGANDiscriminator, DCGANGenerator

    class Record(Callback):
        name = "record"

        def __init__(self):
            self.weights = []

        def on_step_end(self, trainer):
            self.weights.append(copy.deepcopy(trainer.accelerator.unwrap_model(trainer.G).state_dict()))

    torch.manual_seed(0)
    G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    record = Record()
    config = TrainConfig(max_steps=5, batch_size=4, grad_accum_steps=2, z_dim=8, ema_half_life=24.0, ema_rampup=0.5,
                         ema_batchnorm="recompute", sample_every=100, checkpoint_every=100, num_samples=4,
                         output_dir=str(tmp_path / "run"), progress_bar=False)
    trainer = GANTrainer(G, D, DataLoader(TensorDataset(torch.rand(64, 1, 28, 28) * 2 - 1), batch_size=4,
                                                           drop_last=True), config, callbacks=[record])
    trainer.fit()
    per_step = 4 * 2  # batch x accumulation x 1 process
    expected = {k: v.clone() for k, v in record.weights[0].items() if v.is_floating_point()}
    for step, weights in enumerate(record.weights[1:], start=1):
        beta = 0.5 ** (per_step / min(24.0, 0.5 * per_step * step))
        for k in expected:
            if "running" not in k:
                expected[k] = beta * expected[k] + (1 - beta) * weights[k]
    ema = trainer.ema
    assert ema.images_seen == 5 * per_step
    for name, param in ema.module.named_parameters():
        assert torch.allclose(param, expected[name], atol=1e-6), name
    # Sampling recomputes the average's BatchNorm statistics: they are no longer G's.
    module = trainer.sampling_generator()
    assert not ema.stale
    G_stats = trainer.accelerator.unwrap_model(trainer.G).state_dict()
    assert not torch.allclose(module.state_dict()["net.1.running_mean"], G_stats["net.1.running_mean"])
