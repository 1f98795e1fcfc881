"""Any kind of sample and any kind of data: custom latents, 2-D points, other tensors, iterable datasets,
and the preflight checks that catch what used to slip through."""

from __future__ import annotations

import warnings

import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from conftest import assert_close_dicts, params, reset_accelerate_state
from gan_accel import GANTrainer, PreflightError, PreflightWarning, TrainConfig
from gan_accel.models import DCGANDiscriminator, DCGANGenerator, MLPDiscriminator, MLPGenerator
from gan_accel.storage.run_folder import read_fixed_latents


def config(tmp_path, **overrides) -> TrainConfig:
    cfg = dict(max_steps=4, batch_size=8, log_every=2, sample_every=2, checkpoint_every=100, num_samples=16,
               output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def image_loader(n=64, size=28, batch=8):
    images = torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return DataLoader(TensorDataset(images), batch_size=batch, shuffle=True, drop_last=True)


# -- latents of the user's own kind -------------------------------------------------------------------
def test_a_latent_sampler_of_another_size_makes_the_fixed_noise_too(tmp_path):
    """The first sample grid used to crash: the fixed noise was built from config.z_dim (100), not the sampler."""
    torch.manual_seed(0)
    G, D = DCGANGenerator(z_dim=16, width=8), DCGANDiscriminator(width=8)
    sampler = lambda n, device: torch.randn(n, 16, device=device)  # noqa: E731
    GANTrainer(G, D, image_loader(), config(tmp_path), latent_sampler=sampler).fit()
    run = tmp_path / "run"
    assert [p.name for p in sorted(run.glob("samples_*.png"))] == ["samples_000002.png", "samples_000004.png",
                                                                    "samples_final.png"]
    assert read_fixed_latents(run)[0].shape == (16, 16)


class DictG(nn.Module):
    """Takes structured latents: a dict with noise and a per-sample brightness offset."""

    def __init__(self):
        super().__init__()
        self.body = DCGANGenerator(z_dim=8, width=8)

    def forward(self, latents):
        return (self.body(latents["z"]) + 0.1 * latents["shift"].view(-1, 1, 1, 1)).clamp(-1, 1)


def test_structured_latents_flow_to_G_and_to_the_fixed_noise(tmp_path):
    torch.manual_seed(0)
    sampler = lambda n, device: {"z": torch.randn(n, 8, device=device), "shift": torch.rand(n, device=device)}  # noqa
    trainer = GANTrainer(DictG(), DCGANDiscriminator(width=8), image_loader(), config(tmp_path), latent_sampler=sampler)
    trainer.fit()
    fixed = read_fixed_latents(tmp_path / "run")[0]
    assert fixed["z"].shape == (16, 8) and fixed["shift"].shape == (16,)
    assert (tmp_path / "run" / "samples_final.png").exists()


def test_fixed_latents_are_independent_of_the_training_rng(tmp_path):
    torch.manual_seed(0)
    G, D = DCGANGenerator(z_dim=8, width=8), DCGANDiscriminator(width=8)
    trainer = GANTrainer(G, D, image_loader(), config(tmp_path, z_dim=8, seed=3))
    expected = torch.randn(16, 8, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(trainer.fixed_latents, expected)  # the seed's draw, on every process alike
    # The training noise starts exactly at the seed: drawing the fixed latents consumed none of it.
    assert torch.equal(torch.get_rng_state(), torch.manual_seed(3).get_state())


# -- samples by the kind of data --------------------------------------------------------------------------
def test_two_dimensional_points_get_scatter_plots_and_a_gif(tmp_path):
    points = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(points), batch_size=32, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    GANTrainer(MLPGenerator(z_dim=2), MLPDiscriminator(), loader,
               config(tmp_path, batch_size=32, z_dim=2, num_samples=200)).fit()
    run = tmp_path / "run"
    for name in ("samples_000002.png", "samples_000004.png", "samples_final.png"):
        with Image.open(run / name) as image:
            assert image.size == (480, 480), name  # a plot, not a 2x200-pixel "image grid"
            colours = {c for _, c in image.convert("RGB").getcolors(maxcolors=100000)}
            assert (31, 90, 200) in colours and (230, 120, 20) in colours  # samples and real points
    with Image.open(run / "progress.gif") as gif:
        assert gif.n_frames == 2


def test_other_tensors_are_saved_as_tensors(tmp_path):
    sequences = torch.randn(128, 12, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(sequences), batch_size=16, drop_last=True)
    torch.manual_seed(0)
    G = MLPGenerator(z_dim=4, out_dim=12, hidden=16, depth=2)
    D = MLPDiscriminator(in_dim=12, hidden=16, depth=2)
    GANTrainer(G, D, loader, config(tmp_path, batch_size=16, z_dim=4)).fit()
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("samples_*")) == ["samples_000002.pt", "samples_000004.pt",
                                                              "samples_final.pt"]
    assert torch.load(run / "samples_final.pt").shape == (16, 12)
    assert not (run / "progress.gif").exists()


# -- iterable datasets -----------------------------------------------------------------------------------
class Stream(IterableDataset):
    """A deterministic stream: 40 images per epoch, reshuffled by epoch (set_epoch)."""

    def __init__(self):
        self.images = torch.rand(40, 1, 28, 28, generator=torch.Generator().manual_seed(5)) * 2 - 1
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(40, generator=torch.Generator().manual_seed(self.epoch))
        return iter(self.images[order])


def stream_trainer(tmp_path, folder):
    torch.manual_seed(0)
    G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    loader = DataLoader(Stream(), batch_size=8, drop_last=True)  # 5 batches per epoch
    return GANTrainer(G, D, loader, config(tmp_path, z_dim=8, max_steps=8, output_dir=str(tmp_path / folder),
                                           checkpoint_every=3))


def test_iterable_datasets_train_across_epochs_and_resume_exactly_when_deterministic(tmp_path, capsys):
    straight = stream_trainer(tmp_path, "straight")
    straight.fit()
    assert straight.epoch == 1 and straight.images_seen == 8 * 8
    reset_accelerate_state()
    stream_trainer(tmp_path, "resumed").fit(stop_at_step=3)
    reset_accelerate_state()
    capsys.readouterr()
    resumed = stream_trainer(tmp_path, "resumed")
    resumed.fit(resume_from="latest")
    assert "the data is an IterableDataset, so resuming mid-epoch reads and skips 3 batches" in capsys.readouterr().out
    assert_close_dicts(params(resumed.G), params(straight.G), atol=0)
    assert_close_dicts(params(resumed.D), params(straight.D), atol=0)


def test_an_empty_iterable_dataset_is_one_clear_error(tmp_path):
    class Empty(IterableDataset):
        def __iter__(self):
            return iter(())

    G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    with pytest.raises(PreflightError, match="the dataloader yields no batches"):
        GANTrainer(G, D, DataLoader(Empty(), batch_size=8), config(tmp_path, z_dim=8))


# -- preflight: what used to slip through ------------------------------------------------------------------
def test_a_latent_sampler_that_ignores_the_batch_size_is_refused(tmp_path):
    G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    with pytest.raises(PreflightError, match="returned a batch of 64 when asked for 2"):
        GANTrainer(G, D, image_loader(), config(tmp_path), latent_sampler=lambda n, device: torch.randn(64, 8))


def test_uint8_data_is_refused_with_the_conversion(tmp_path):
    images = torch.randint(0, 256, (32, 1, 28, 28), dtype=torch.uint8)
    G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    with pytest.raises(PreflightError, match=r"real samples are torch.uint8: convert them .* x / 127.5 - 1"):
        GANTrainer(G, D, DataLoader(TensorDataset(images), batch_size=8), config(tmp_path, z_dim=8))


def test_a_generator_of_another_dtype_than_the_data_is_refused(tmp_path):
    G, D = DCGANGenerator(z_dim=8, width=4).double(), DCGANDiscriminator(width=4)
    sampler = lambda n, device: torch.randn(n, 8, dtype=torch.float64)  # noqa: E731
    with pytest.raises(PreflightError, match="G produces torch.float64 samples but the real data is torch.float32"):
        GANTrainer(G, D, image_loader(), config(tmp_path), latent_sampler=sampler)


def test_data_outside_tanh_range_warns(tmp_path):
    images = torch.rand(32, 1, 28, 28) * 255  # forgot to scale
    G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    with pytest.warns(PreflightWarning, match=r"G ends in tanh .* real data lies in \[.*, 25\d\.?\d*\]"):
        GANTrainer(G, D, DataLoader(TensorDataset(images), batch_size=8), config(tmp_path, z_dim=8))


def test_a_discriminator_ending_in_sigmoid_warns(tmp_path):
    class SigmoidD(DCGANDiscriminator):
        def forward(self, x):
            return torch.sigmoid(super().forward(x))

    G = DCGANGenerator(z_dim=8, width=4)
    with pytest.warns(PreflightWarning, match="D ends in a sigmoid, but gan_accel's losses take logits"):
        GANTrainer(G, SigmoidD(width=4), image_loader(), config(tmp_path, z_dim=8))


def test_a_correct_setup_raises_no_warning(tmp_path):
    G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PreflightWarning)
        GANTrainer(G, D, image_loader(), config(tmp_path, z_dim=8))
