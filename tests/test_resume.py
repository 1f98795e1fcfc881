"""Exact resume: k steps + checkpoint + resume + (N - k) steps == N steps straight, bit for bit."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import launch_two_processes, reset_accelerate_state
from gan_accel.callbacks.metrics_log import read_metrics

N_STEPS, STOP_AT = 8, 3


def build_trainer(out_dir: str, init_seed: int = 0, conditional: bool = False, **overrides):
    """A small DCGAN (with BatchNorm) on a shuffled loader; every source of state is exercised.

    ``conditional``: the conditional DCGAN and projection D on labelled images, uniform G labels.
    """
    from gan_accel import GANTrainer, TrainConfig
    from gan_accel.models import ConditionalDCGANGenerator, DCGANDiscriminator, DCGANGenerator, ProjectionDiscriminator

    torch.manual_seed(init_seed)
    if conditional:
        G, D = ConditionalDCGANGenerator(5, z_dim=8, width=4), ProjectionDiscriminator(5, width=4)
        overrides["num_classes"] = 5
    else:
        G, D = DCGANGenerator(z_dim=8, width=4), DCGANDiscriminator(width=4)
    images = torch.rand(40, 1, 28, 28, generator=torch.Generator().manual_seed(3)) * 2 - 1
    labels = torch.randint(5, (40,), generator=torch.Generator().manual_seed(4))
    # 10 batches per epoch, 2 per step: the stop at step 3 lands mid-epoch.
    dataset = TensorDataset(images, labels) if conditional else TensorDataset(images)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, drop_last=True)
    settings = dict(max_steps=N_STEPS, batch_size=4, grad_accum_steps=2, z_dim=8, ema_decay=0.9,
                    log_every=1, sample_every=4, checkpoint_every=3, num_samples=4, warmup_ratio=0.25,
                    output_dir=out_dir, progress_bar=False)
    config = TrainConfig(**{**settings, **overrides})
    return GANTrainer(G, D, loader, config)


def snapshot(trainer) -> dict:
    from accelerate.utils import extract_model_from_parallel

    return {
        "G": {k: v.clone() for k, v in extract_model_from_parallel(trainer.G).state_dict().items()},
        "D": {k: v.clone() for k, v in extract_model_from_parallel(trainer.D).state_dict().items()},
        "opt_G": trainer.opt_G.state_dict(), "opt_D": trainer.opt_D.state_dict(),
        "ema": trainer.ema.state_dict()["module"],
    }


def assert_identical(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_identical(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a} != {b}"


def metric_rows(run_dir) -> list[dict]:
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    for row in rows:
        row.pop("images/s")  # wall-clock, the only thing allowed to differ
    return rows


def _straight(out_dir: str, **overrides) -> None:
    trainer = build_trainer(os.path.join(out_dir, "straight"), **overrides)
    trainer.fit()
    rank = trainer.accelerator.process_index
    torch.save(snapshot(trainer), os.path.join(out_dir, f"straight_{rank}.pt"))


def _interrupted(out_dir: str, **overrides) -> None:
    build_trainer(os.path.join(out_dir, "resumed"), **overrides).fit(stop_at_step=STOP_AT)


def _resumed(out_dir: str, **overrides) -> None:
    # Different initial weights and a shifted global RNG: everything must come from the checkpoint.
    torch.manual_seed(1234)
    trainer = build_trainer(os.path.join(out_dir, "resumed"), init_seed=99, **overrides)
    trainer.fit(resume_from="latest")
    rank = trainer.accelerator.process_index
    torch.save(snapshot(trainer), os.path.join(out_dir, f"resumed_{rank}.pt"))


def check_runs(out, ranks) -> None:
    for rank in ranks:
        assert_identical(torch.load(out / f"straight_{rank}.pt"), torch.load(out / f"resumed_{rank}.pt"))
    straight, resumed = out / "straight", out / "resumed"
    assert metric_rows(straight) == metric_rows(resumed)  # ADA's augment/p and augment/rt included
    assert [r["step"] for r in metric_rows(resumed)] == list(range(1, N_STEPS + 1))
    assert (straight / "samples_final.png").read_bytes() == (resumed / "samples_final.png").read_bytes()
    assert (straight / "samples_000008.png").read_bytes() == (resumed / "samples_000008.png").read_bytes()


STYLEGAN_EMA = {"ema_decay": None, "ema_half_life": 20.0, "ema_rampup": 0.5, "ema_batchnorm": "recompute"}


# ADA from p = 0.3, moving every step by 8 / 50 (the real logits of a step over 50 images): the augmentations'
# draws, p and the partial interval must all continue exactly. DiffAugment's draws likewise.
ADA = {"augment": "ada", "augment_p": 0.3, "ada_interval": 1, "ada_kimg": 0.05, "r1_gamma": 1.0, "r1_every": 2}


@pytest.mark.parametrize("overrides", [{}, {"r1_gamma": 1.0, "r1_every": 4, "n_critic": 2}, {"conditional": True},
                                       STYLEGAN_EMA, ADA, {"augment": "diffaugment"}],
                         ids=["default phases", "n_critic 2 + lazy R1 every 4", "conditional",
                              "EMA half-life, ramp-up, recomputed BatchNorm", "ADA + lazy R1", "DiffAugment"])
def test_resume_mid_epoch_is_bitwise_identical_one_process(tmp_path, overrides):
    _straight(str(tmp_path), **overrides)
    reset_accelerate_state()
    _interrupted(str(tmp_path), **overrides)
    from gan_accel import list_checkpoints

    assert [p.name for p in list_checkpoints(tmp_path / "resumed")] == ["checkpoint_00000003"]
    reset_accelerate_state()
    _resumed(str(tmp_path), **overrides)
    check_runs(tmp_path, ranks=[0])


CASES = {"unconditional": False, "conditional": True}


def _from_scratch(out_dir: str) -> None:
    """Each case's straight run, then its interrupted one, in one launch: all start from scratch (the resumed
    runs, which must find everything in the checkpoint, get processes of their own)."""
    for case, conditional in CASES.items():
        os.makedirs(os.path.join(out_dir, case), exist_ok=True)
        _straight(os.path.join(out_dir, case), conditional=conditional)
        reset_accelerate_state()
        _interrupted(os.path.join(out_dir, case), conditional=conditional)
        reset_accelerate_state()


def _resumed_all(out_dir: str) -> None:
    for case, conditional in CASES.items():
        _resumed(os.path.join(out_dir, case), conditional=conditional)
        reset_accelerate_state()


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """Two launches for both cases (each launch costs a spawn, imports and a gloo rendezvous)."""
    out = tmp_path_factory.mktemp("two_processes")
    launch_two_processes(_from_scratch, args=(str(out),), num_processes=2)
    from gan_accel import list_checkpoints

    for case in CASES:
        assert [p.name for p in list_checkpoints(out / case / "resumed")] == ["checkpoint_00000003"]
    launch_two_processes(_resumed_all, args=(str(out),), num_processes=2)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_resume_mid_epoch_is_bitwise_identical_two_processes(two_process_runs, case):
    tmp_path = two_process_runs / case
    check_runs(tmp_path, ranks=[0, 1])
    final = tmp_path / "resumed" / "checkpoints" / "checkpoint_00000008"
    rng_files = sorted(p.name for p in final.iterdir())
    assert "random_states_0.pkl" in rng_files and "random_states_1.pkl" in rng_files
    # One copy of the EMA per checkpoint: process 1's file points at process 0's (and resuming above used it).
    from gan_accel.storage.checkpoint import SHARED_STATE

    from gan_accel.storage.safe_tree import load_tree

    main, other = (load_tree(final / f"gan_accel_state_{rank}.safetensors") for rank in (0, 1))
    assert other["callbacks"]["generator_ema"] == SHARED_STATE
    ema_weights = main["callbacks"]["generator_ema"]["module"]
    assert ema_weights and all(isinstance(v, torch.Tensor) for v in ema_weights.values())


def test_resume_without_rng_restore_fails_loudly(tmp_path, monkeypatch):
    """Accelerate only logs a failed RNG restore at INFO level; gan_accel checks and refuses."""
    from gan_accel import CheckpointError

    _interrupted(str(tmp_path))
    reset_accelerate_state()
    import accelerate.checkpointing as checkpointing

    # Simulate Accelerate silently failing to set the torch RNG state.
    monkeypatch.setattr(checkpointing.torch, "set_rng_state", lambda state: None)
    torch.manual_seed(5)
    trainer = build_trainer(str(tmp_path / "resumed"))
    with pytest.raises(CheckpointError, match="RNG state of process 0 was not restored"):
        trainer.fit(resume_from="latest")


@pytest.mark.parametrize("live_matches", [True, False], ids=["restored", "not-restored"])
def test_the_cuda_rng_state_is_checked_like_the_cpu_one(tmp_path, monkeypatch, live_matches):
    """Accelerate saves one CUDA generator state per device and only logs when it cannot set them; a
    resume that silently kept the old CUDA state would draw other noise on the GPU. Simulated here: a
    CUDA that "is available" and reports its live generator states."""
    from accelerate import Accelerator

    from gan_accel import CheckpointError
    from gan_accel.storage.checkpoint import check_rng_restored

    saved_cuda = [torch.arange(16, dtype=torch.uint8), torch.arange(16, dtype=torch.uint8) * 2]
    live = [s.clone() for s in saved_cuda]
    if not live_matches:
        live[1][3] += 1  # the second device's generator was not set
    torch.save({"torch_manual_seed": torch.get_rng_state(), "torch_cuda_manual_seed": saved_cuda},
               tmp_path / "random_states_0.pkl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: live)
    reset_accelerate_state()
    accelerator = Accelerator(cpu=True)
    if live_matches:
        check_rng_restored(accelerator, tmp_path)
    else:
        with pytest.raises(CheckpointError, match="cuda RNG state of process 0 was not restored"):
            check_rng_restored(accelerator, tmp_path)
    # Saved on a GPU, resumed on a machine without one: nothing to restore into, nothing to compare.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_rng_restored(accelerator, tmp_path)
