"""Two real processes over gloo (spawned, as accelerate.debug_launcher but without fork): what multi-GPU users depend on."""

from __future__ import annotations

import os

import pytest
import torch

from conftest import (TableEpsilon, TableLatents, assert_close_dicts, launch_two_processes, make_images, make_loader, make_models, params,
                      reset_accelerate_state)
from gan_accel.callbacks.metrics_log import read_metrics

pytestmark = pytest.mark.slow

STEPS, B = 6, 4


def _train(out_dir: str, batch_size: int, grad_accum_steps: int, penalties: bool = False) -> None:
    """Runs on every process; saves what each rank ended with.

    ``penalties``: WGAN-GP in every D step and a lazy R1 phase (every 2nd D step): their input
    gradients bypass DDP's reducer, so only the penalties' design makes the ranks agree.
    """
    from accelerate import PartialState

    from gan_accel import GANTrainer, Phase, TrainConfig, discriminator_loss, generator_loss, gradient_penalty, sum_losses
    from gan_accel import r1_phase
    from gan_accel.objectives.losses import LOSSES

    G, D = make_models(0)
    config = TrainConfig(max_steps=STEPS, batch_size=batch_size, grad_accum_steps=grad_accum_steps, z_dim=4,
                         lr_G=1e-2, lr_D=1e-2, warmup_ratio=0.5, log_every=1, sample_every=STEPS, num_samples=4,
                         output_dir=os.path.join(out_dir, "run"), progress_bar=False)
    phases, epsilon = None, TableEpsilon()
    if penalties:
        loss = LOSSES["wasserstein"]
        phases = [Phase("D", "D", sum_losses(discriminator_loss(loss), gradient_penalty(10.0, epsilon)),
                        new_data=True, double_backward=True),
                  r1_phase(1.0, every=2), Phase("G", "G", generator_loss(loss))]
    images = make_images(2 * B * STEPS * grad_accum_steps)
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(images, batch_size), config, latent_sampler=latents, phases=phases)
    latents.rewind()
    epsilon.rewind()
    seen_batch_sizes = []  # registered after the trainer's preflight (a 2-image dry forward)
    trainer.accelerator.unwrap_model(trainer.D).register_forward_pre_hook(
        lambda m, args: seen_batch_sizes.append(args[0].shape[0]))
    trainer.fit()
    rank = PartialState().process_index
    torch.save(
        {"G": params(trainer.G), "D": params(trainer.D), "world": trainer.accelerator.num_processes,
         "distributed": trainer.accelerator.distributed_type.value, "batch_sizes": sorted(set(seen_batch_sizes)),
         "sched_ticks": trainer.sched_G.scheduler.last_epoch},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )


def _lr_curve(run_dir):
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    return [(r["step"], r["lr/G"], r["lr/D"]) for r in rows]


@pytest.mark.parametrize("grad_accum_steps, penalties", [(1, False), (2, False), (2, True)],
                         ids=["plain", "accumulation", "accumulation+gp+lazy_r1"])
def test_two_processes_equal_one_process_with_double_batch(tmp_path, grad_accum_steps, penalties):
    two = tmp_path / "two"
    two.mkdir()
    launch_two_processes(_train, args=(str(two), B, grad_accum_steps, penalties), num_processes=2)
    rank0, rank1 = (torch.load(two / f"rank{r}.pt") for r in (0, 1))
    assert rank0["world"] == rank1["world"] == 2 and rank0["distributed"] == "MULTI_CPU"
    assert rank0["batch_sizes"] == rank1["batch_sizes"] == [B], "per-process batch must be the configured one"
    assert_close_dicts(rank0["G"], rank1["G"], atol=0)  # DDP keeps the ranks bitwise identical
    assert_close_dicts(rank0["D"], rank1["D"], atol=0)
    # Accelerate ticks the scheduler twice per optimizer step on 2 processes; the curve must not care.
    assert rank0["sched_ticks"] == 2 * STEPS

    reset_accelerate_state()
    one = tmp_path / "one"
    one.mkdir()
    _train(str(one), 2 * B, grad_accum_steps, penalties)
    single = torch.load(one / "rank0.pt")
    assert single["world"] == 1
    # float64: the two runs differ only by the order of summation (DDP averages two half-batch means).
    assert_close_dicts(rank0["G"], single["G"], atol=1e-10)
    assert_close_dicts(rank0["D"], single["D"], atol=1e-10)
    curve_two, curve_one = _lr_curve(two / "run"), _lr_curve(one / "run")
    assert curve_two == curve_one
    assert len({lr for _, lr, _ in curve_one}) > 3, "the curve should warm up and decay, not be flat"
