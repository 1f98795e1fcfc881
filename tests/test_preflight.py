"""Bad input is caught before training with a message that names the problem and the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from conftest import TableLatents, TinyD, TinyG, make_images, make_loader, make_models
from gan_accel import CheckpointError, PreflightError, RunFolderError, TrainConfig
from gan_accel import GANTrainer as _GANTrainer


def GANTrainer(G, D, loader, cfg):
    """The fixtures are float64: feed them float64 latents."""
    return _GANTrainer(G, D, loader, cfg, latent_sampler=TableLatents(4096))
from gan_accel.storage.checkpoint import ENGINE_STATE


def config(tmp_path, **overrides) -> TrainConfig:
    cfg = dict(max_steps=2, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4,
               checkpoint_every=1, output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def test_generator_output_that_the_data_does_not_match(tmp_path):
    class WideG(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2 * 4 * 4)

        def forward(self, z):
            return self.fc(z).reshape(-1, 2, 4, 4)  # 2 channels; the data has 1

    with pytest.raises(PreflightError, match=r"G produces samples of shape \(2, 4, 4\) but the data has \(1, 4, 4\)"):
        GANTrainer(WideG().double(), TinyD().double(), make_loader(make_images(16), 4), config(tmp_path))


def test_generator_output_the_discriminator_cannot_take(tmp_path):
    class D28(nn.Module):  # expects 28x28 images; the data (and G) make 4x4
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(28 * 28, 1)

        def forward(self, x):
            return self.fc(x.flatten(1)).squeeze(1)

    with pytest.raises(PreflightError, match=r"D failed on real samples of shape \(2, 1, 4, 4\)"):
        GANTrainer(TinyG().double(), D28().double(), make_loader(make_images(16), 4), config(tmp_path))


def test_discriminator_must_return_one_logit_per_image(tmp_path):
    class TwoLogitD(TinyD):
        def forward(self, x):
            return self.net(x).repeat(1, 2)  # (N, 2)

    G, _ = make_models()
    with pytest.raises(PreflightError, match=r"D must return one logit per sample.*returned \(2, 2\)"):
        GANTrainer(G, TwoLogitD().double(), make_loader(make_images(16), 4), config(tmp_path))


def test_unsupported_batch_form_lists_the_supported_ones(tmp_path):
    class Named(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"pixels": torch.zeros(1, 4, 4)}

    G, D = make_models()
    with pytest.raises(PreflightError, match=r"dict with one of the keys \['image', 'images', 'pixel_values', 'img'\]"):
        GANTrainer(G, D, DataLoader(Named(), batch_size=4), config(tmp_path))


def test_dict_batches_with_an_image_key_are_accepted(tmp_path):
    class Dicts(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"image": torch.zeros(1, 4, 4, dtype=torch.float64), "label": i}

    G, D = make_models()
    GANTrainer(G, D, DataLoader(Dicts(), batch_size=4), config(tmp_path)).fit()


def test_empty_dataset(tmp_path):
    G, D = make_models()
    with pytest.raises(PreflightError, match="the training dataset is empty"):
        GANTrainer(G, D, DataLoader(TensorDataset(torch.zeros(0, 1, 4, 4)), batch_size=4), config(tmp_path))


def test_batch_size_larger_than_dataset_with_drop_last(tmp_path):
    G, D = make_models()
    loader = DataLoader(TensorDataset(make_images(3)), batch_size=4, drop_last=True)
    with pytest.raises(PreflightError, match=r"batch size 4 is larger than the dataset \(3 items\) and drop_last=True"):
        GANTrainer(G, D, loader, config(tmp_path))


def test_preflight_leaves_rng_and_batchnorm_statistics_untouched(tmp_path):
    from gan_accel.models import DCGANDiscriminator, DCGANGenerator

    torch.manual_seed(0)
    G, D = DCGANGenerator(z_dim=4, width=4), DCGANDiscriminator(width=4)
    buffers = [b.clone() for m in (G, D) for b in m.buffers()]
    loader = DataLoader(TensorDataset(torch.rand(8, 1, 28, 28) * 2 - 1), batch_size=4, shuffle=True)
    from gan_accel import TrainConfig, default_phases
    from gan_accel.engine.latents import gaussian_latents
    from gan_accel.engine.phases import PhasePlan
    from gan_accel.engine.preflight import dry_run

    state = torch.get_rng_state()
    plan = PhasePlan(default_phases(TrainConfig(z_dim=4, r1_gamma=1.0, r1_every=2)), ["G", "D"])
    dry_run({"G": G, "D": D}, plan, loader, gaussian_latents(4))
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(buffers, [b for m in (G, D) for b in m.buffers()]))


def test_output_folder_holding_another_run_is_refused_and_left_alone(tmp_path):
    G, D = make_models()
    GANTrainer(G, D, make_loader(make_images(16), 4), config(tmp_path)).fit()
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    G, D = make_models()
    with pytest.raises(RunFolderError, match=r"holds a run: continue it with `--resume latest`, or choose another"):
        GANTrainer(G, D, make_loader(make_images(16), 4), config(tmp_path)).fit()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before, "nothing saved may be touched"


def test_resume_path_that_does_not_exist(tmp_path):
    G, D = make_models()
    trainer = GANTrainer(G, D, make_loader(make_images(16), 4), config(tmp_path))
    with pytest.raises(CheckpointError, match="does not exist: pass a checkpoint folder or 'latest'"):
        trainer.fit(resume_from=tmp_path / "nope")


def test_resume_latest_without_checkpoints(tmp_path):
    G, D = make_models()
    trainer = GANTrainer(G, D, make_loader(make_images(16), 4), config(tmp_path))
    with pytest.raises(CheckpointError, match="no complete checkpoint under"):
        trainer.fit(resume_from="latest")


def _finished_run(tmp_path):
    G, D = make_models()
    GANTrainer(G, D, make_loader(make_images(16), 4), config(tmp_path)).fit()
    return tmp_path / "run" / "checkpoints" / "checkpoint_00000002"


def test_checkpoint_from_a_different_model_shape(tmp_path):
    checkpoint = _finished_run(tmp_path)

    class WiderD(TinyD):
        def __init__(self):
            super().__init__()
            self.net[1] = nn.Linear(16, 32)
            self.net[3] = nn.Linear(32, 1)

    from conftest import reset_accelerate_state

    reset_accelerate_state()
    G, _ = make_models()
    trainer = GANTrainer(G, WiderD().double(), make_loader(make_images(16), 4), config(tmp_path, max_steps=3))
    with pytest.raises(CheckpointError, match="a model of another shape or width"):
        trainer.fit(resume_from=checkpoint)


@pytest.mark.parametrize("victim", ["model.safetensors", ENGINE_STATE.format(rank=0)])
def test_truncated_checkpoint_file(tmp_path, victim):
    checkpoint = _finished_run(tmp_path)
    data = (checkpoint / victim).read_bytes()
    (checkpoint / victim).write_bytes(data[: len(data) // 2])
    from conftest import reset_accelerate_state

    reset_accelerate_state()
    G, D = make_models()
    trainer = GANTrainer(G, D, make_loader(make_images(16), 4), config(tmp_path, max_steps=3))
    with pytest.raises(CheckpointError, match=f"cannot (read|restore) .*{checkpoint.name}"):
        trainer.fit(resume_from="latest")


def test_partial_checkpoint_folder_is_never_picked(tmp_path):
    from gan_accel import latest_checkpoint

    checkpoint = _finished_run(tmp_path)
    partial = checkpoint.parent / ".tmp-checkpoint_00000009"
    partial.mkdir()
    assert latest_checkpoint(tmp_path / "run") == checkpoint
    with pytest.raises(CheckpointError, match="not a complete gan_accel checkpoint"):
        from gan_accel.storage.checkpoint import resolve_resume

        resolve_resume(partial, tmp_path / "run")


def test_only_the_last_k_checkpoints_are_kept(tmp_path):
    from gan_accel import list_checkpoints

    G, D = make_models()
    GANTrainer(G, D, make_loader(make_images(16), 4), config(tmp_path, max_steps=5, keep_checkpoints=2)).fit()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint_00000004", "checkpoint_00000005"]
