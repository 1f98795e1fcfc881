"""Two real processes over gloo (spawned, as accelerate.debug_launcher but without fork): what multi-GPU users depend on."""

from __future__ import annotations

import os

import pytest
import torch

from conftest import (NUM_CLASSES, TableEpsilon, TableLabels, TableLatents, assert_close_dicts, launch_two_processes,
                      make_images, make_labels, make_loader, make_models, params, reset_accelerate_state)
from gan_accel.callbacks.metrics_log import read_metrics

pytestmark = pytest.mark.slow

STEPS, B = 6, 4


def _train(out_dir: str, batch_size: int, grad_accum_steps: int, penalties: bool = False,
           conditional: bool = False) -> None:
    """Runs on every process; saves what each rank ended with.

    ``penalties``: WGAN-GP in every D step and a lazy R1 phase (every 2nd D step): their input
    gradients bypass DDP's reducer, so only the penalties' design makes the ranks agree.
    ``conditional``: labelled data, G(z, y) and a projection D(x, y): the labels must stay with their
    images when Accelerate shards the batches.
    """
    from accelerate import PartialState

    from gan_accel import GANTrainer, Phase, TrainConfig, discriminator_loss, generator_loss, gradient_penalty, sum_losses
    from gan_accel import r1_phase
    from gan_accel.objectives.losses import LOSSES

    G, D = make_models(0, conditional=conditional)
    config = TrainConfig(max_steps=STEPS, batch_size=batch_size, grad_accum_steps=grad_accum_steps, z_dim=4,
                         lr_G=1e-2, lr_D=1e-2, warmup_ratio=0.5, log_every=1, sample_every=STEPS, num_samples=4,
                         output_dir=os.path.join(out_dir, "run"), progress_bar=False,
                         num_classes=NUM_CLASSES if conditional else None)
    phases, epsilon = None, TableEpsilon()
    if penalties:
        loss = LOSSES["wasserstein"]
        phases = [Phase("D", "D", sum_losses(discriminator_loss(loss), gradient_penalty(10.0, epsilon)),
                        new_data=True, double_backward=True),
                  r1_phase(1.0, every=2), Phase("G", "G", generator_loss(loss))]
    images = make_images(2 * B * STEPS * grad_accum_steps)
    latents, fake_labels = TableLatents(4096), TableLabels() if conditional else None
    labels = make_labels(len(images)) if conditional else None
    trainer = GANTrainer(G, D, make_loader(images, batch_size, labels), config, latent_sampler=latents, phases=phases,
                         label_sampler=fake_labels)
    latents.rewind()
    if fake_labels is not None:
        fake_labels.rewind()
    epsilon.rewind()
    # registered after the trainer's preflight (a 2-image dry forward); the training forwards only (the health
    # monitor's probe of D runs without gradients)
    seen_batch_sizes = []
    trainer.accelerator.unwrap_model(trainer.D).register_forward_pre_hook(
        lambda m, args: seen_batch_sizes.append(args[0].shape[0]) if torch.is_grad_enabled() else None)
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


CASES = {"plain": (1, False, False), "accumulation": (2, False, False), "accumulation+gp+lazy_r1": (2, True, False),
         "accumulation+conditional": (2, False, True)}


def _everything_on_two_processes(out_dir: str) -> None:
    """One launch for every two-process check of this file (each launch costs a spawn, imports and a gloo
    rendezvous): the four trainings, the paired-label run and its resume, then a script that closes the group."""
    for name, case in CASES.items():
        reset_accelerate_state()
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        _train(os.path.join(out_dir, name), B, *case)
    for resume in (False, True):
        reset_accelerate_state()
        _paired(os.path.join(out_dir, "paired"), resume)
    reset_accelerate_state()
    _script_then_report(os.path.join(out_dir, "script"))


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_processes")
    for name in ("paired", "script"):
        (out / name).mkdir()
    launch_two_processes(_everything_on_two_processes, args=(str(out),), num_processes=2)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_equal_one_process_with_double_batch(launched, tmp_path, case):
    grad_accum_steps, penalties, conditional = CASES[case]
    two = launched / case
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
    _train(str(one), 2 * B, grad_accum_steps, penalties, conditional)
    single = torch.load(one / "rank0.pt")
    assert single["world"] == 1
    # float64: the two runs differ only by the order of summation (DDP averages two half-batch means).
    assert_close_dicts(rank0["G"], single["G"], atol=1e-10)
    assert_close_dicts(rank0["D"], single["D"], atol=1e-10)
    curve_two, curve_one = _lr_curve(two / "run"), _lr_curve(one / "run")
    assert curve_two == curve_one
    assert len({lr for _, lr, _ in curve_one}) > 3, "the curve should warm up and decay, not be flat"


class PairCheckingD(torch.nn.Module):
    """Wraps a conditional D and records, for every real image it sees, whether its label is its own.

    Real images are constant: image i is filled with code(label_i); G's samples never are."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.checked, self.mismatched = 0, 0

    def forward(self, x, y):
        flat = x.detach().flatten(1)
        constant = (flat.max(1).values - flat.min(1).values) == 0
        codes = torch.round((flat[:, 0] + 0.9) * 10).long()  # inverse of code() below
        self.checked += int(constant.sum())
        self.mismatched += int((codes[constant] != y[constant]).sum())
        return self.inner(x, y)


def _paired(out_dir: str, resume: bool) -> None:
    from accelerate import PartialState
    from torch.utils.data import DataLoader, TensorDataset

    from gan_accel import GANTrainer, TrainConfig

    G, D = make_models(0, conditional=True)
    D = PairCheckingD(D)
    labels = make_labels(96)
    images = ((labels.double() / 10 - 0.9).view(-1, 1, 1, 1) * torch.ones(96, 1, 4, 4, dtype=torch.float64))
    loader = DataLoader(TensorDataset(images, labels), batch_size=4, shuffle=True, drop_last=True)
    config = TrainConfig(max_steps=8, batch_size=4, grad_accum_steps=2, z_dim=4, num_classes=NUM_CLASSES,
                         label_distribution="data", checkpoint_every=3, sample_every=100, num_samples=3,
                         output_dir=os.path.join(out_dir, "run"), progress_bar=False)
    trainer = GANTrainer(G, D, loader, config)
    D.checked = D.mismatched = 0  # only what training shows D
    trainer.fit(resume_from="latest" if resume else None, stop_at_step=None if resume else 5)
    rank = PartialState().process_index
    torch.save({"checked": D.checked, "mismatched": D.mismatched, "step": trainer.step},
               os.path.join(out_dir, f"paired_{int(resume)}_{rank}.pt"))


def test_labels_stay_with_their_images_through_sharding_accumulation_and_resume(launched):
    """Two processes, a shuffled loader (12 batches of 4 per epoch), accumulation 2, a stop at step 5
    (mid-epoch, past a checkpoint at 3) and a resume: D checks every real image's label against the
    label written into the image itself."""
    for part in (0, 1):
        for rank in (0, 1):
            seen = torch.load(launched / "paired" / f"paired_{part}_{rank}.pt")
            assert seen["checked"] > 0 and seen["mismatched"] == 0, seen
    assert torch.load(launched / "paired" / "paired_1_0.pt")["step"] == 8


def _script_then_report(out_dir: str) -> None:
    """A script's body run through run_script on every rank: it must leave the gloo group closed."""
    import torch.distributed as dist
    from accelerate import PartialState

    from gan_accel.ending import run_script

    PartialState()
    rank = dist.get_rank()
    code = run_script(lambda: 0)
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(f"{code} {dist.is_initialized()}")


def test_a_successful_script_closes_the_process_group_on_every_rank(launched):
    """Without destroy_process_group, gloo's threads meet interpreter finalization and a rank can abort
    at exit (exit -6) after its work was saved; run_script closes the group after a successful body."""
    assert sorted(p.read_text() for p in (launched / "script").iterdir()) == ["0 False", "0 False"]
