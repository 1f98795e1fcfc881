"""Divergence guard: NaN updates are skipped and logged, persistent NaNs stop the run, no NaN checkpoint."""

from __future__ import annotations

import pytest
import torch

from conftest import TableLatents, make_images, make_loader, make_models, params
from gan_accel import Callback, DivergenceError, GANTrainer, TrainConfig, list_checkpoints
from gan_accel.callbacks.metrics_log import read_metrics


def trainer_on(images, tmp_path, **overrides) -> GANTrainer:
    cfg = dict(max_steps=4, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4, lr_G=1e-2,
               lr_D=1e-2, warmup_ratio=0.0, output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    G, D = make_models()
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(images, 4), TrainConfig(**cfg), latent_sampler=latents)
    latents.rewind()
    return trainer


def test_one_nan_batch_skips_that_d_update_and_is_logged(tmp_path):
    images = make_images(16)
    images[4:8] = float("nan")  # the second batch: D's loss on it is NaN
    trainer = trainer_on(images, tmp_path)
    snapshots = []

    class RecordD(Callback):
        def on_phase_end(self, trainer, phase):
            if phase.net == "D":
                snapshots.append(params(trainer.D))  # D right after its (possibly skipped) update

    trainer.callbacks.add(RecordD())
    D_initial = params(trainer.D)
    trainer.fit()
    # Step 2's D update was skipped: D after step 2 equals D after step 1; steps 1, 3, 4 moved D.
    assert all(torch.equal(snapshots[1][k], snapshots[0][k]) for k in D_initial)
    assert not all(torch.equal(snapshots[0][k], D_initial[k]) for k in D_initial)
    assert not all(torch.equal(snapshots[2][k], snapshots[1][k]) for k in D_initial)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["skipped/D"] for r in rows] == [0, 1, 1, 1] and all(r["skipped/G"] == 0 for r in rows)
    assert all(torch.isfinite(p).all() for p in trainer.D.parameters())
    assert all(torch.isfinite(p).all() for p in trainer.G.parameters())


def test_consecutive_nan_updates_stop_the_run_without_writing_a_checkpoint(tmp_path):
    images = make_images(16)
    images[4:] = float("nan")  # every batch after the first
    trainer = trainer_on(images, tmp_path, max_steps=20, max_bad_updates=3, checkpoint_every=1)
    with pytest.raises(DivergenceError, match="non-finite for 3 consecutive updates"):
        trainer.fit()
    assert trainer.guard.skipped["D"] == 3
    # Only step 1's checkpoint and the steps where D skipped (weights still finite) exist; all finite.
    for checkpoint in list_checkpoints(tmp_path / "run"):
        state = torch.load(checkpoint / "gan_accel_state_0.pt", weights_only=False)
        assert state["step"] <= 3
    assert all(torch.isfinite(p).all() for p in trainer.D.parameters())


def test_checkpoint_with_non_finite_weights_is_refused_and_older_one_kept(tmp_path):
    images = make_images(16)
    images[8:] = float("nan")
    # Guard off: the NaN reaches the weights in step 3; the checkpoint at step 4 must be refused.
    trainer = trainer_on(images, tmp_path, nan_guard=False, checkpoint_every=2, max_steps=4)
    with pytest.raises(DivergenceError, match="refusing to write a checkpoint at step 4"):
        trainer.fit()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint_00000002"]
