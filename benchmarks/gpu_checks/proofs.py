"""Sections that prove the engine against an independent reference on the device: accumulation = a
larger batch, the plain-PyTorch twin loop, and a bitwise resume (CUDA: the CUDA RNG state too)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from .fixtures import (Run, TableLatents, Z_TINY, cpu_state, count_inner_steps, digit_images, identical, loader,
                       make_trainer, max_diff, metric_rows, optimizer_tensors, proof_mode, reset_accelerate,
                       small_dcgan, tiny_images, tiny_models)
from .report import Report, Section


# -- accumulation = larger batch -------------------------------------------------------------------
def sec_accumulation(run: Run, s: Section, report: Report) -> None:
    b, steps = 4, 4
    tolerance = 1e-10
    s.note("Tiny BatchNorm-free networks in float64 (each sample's maths is independent of the batch), fused "
           f"Adam, lr 1e-2, {steps} steps; the runs differ only in summation order: tolerance {tolerance:g}, while a "
           "wrong scale or a missed step moves parameters by ~lr.")
    with proof_mode(run), warnings.catch_warnings():
        # count_inner_steps wraps the optimizers' step, which torch's LambdaLR notices and warns about
        warnings.filterwarnings("ignore", message="Seems like `optimizer.step")
        for k in run.size((2, 4), (2, 4), cpu_quick=(2,)):
            images = tiny_images(k * b * steps * 2)
            small = make_trainer(run, f"accum_k{k}", *tiny_models(), loader(images, b), latents=TableLatents(Z_TINY),
                                 grad_accum_steps=k, max_steps=steps, lr_G=1e-2, lr_D=1e-2)
            s.check(f"k={k}: trains on {run.device.type}", small.accelerator.device.type == run.device.type,
                    str(small.accelerator.device))
            counts = count_inner_steps(small)
            small.fit()
            big = make_trainer(run, f"big_k{k}", *tiny_models(), loader(images, k * b), latents=TableLatents(Z_TINY),
                               max_steps=steps, lr_G=1e-2, lr_D=1e-2)
            big.fit()
            s.check(f"k={k}: each optimizer stepped once per {k} micro-batches", counts == {"G": steps, "D": steps}
                    and small.images_seen == k * b * steps, f"steps {counts}, images {small.images_seen}")
            for net in ("G", "D"):
                diff = max_diff(cpu_state(small.networks[net]), cpu_state(big.networks[net]))
                s.number(f"k={k} max |diff| {net}", diff)
                s.check(f"k={k}: {net} after accumulation = {net} after the {k}x batch", diff <= tolerance,
                        f"max |diff| {diff:.2e} (tolerance {tolerance:g})")
    s.number("summary", "accumulation k x b = batch k*b" + (" (float64)" if not s.failed_checks else ": FAILED"))


# -- the plain-PyTorch twin ---------------------------------------------------------------------------
def plain_tiny_twin(run: Run, images: torch.Tensor, b: int, steps: int, latents: TableLatents, *, lr: float,
                    warmup_ratio: float, clip_D: float | None) -> tuple[dict, dict]:
    """The textbook loop on the device, no Accelerate: D on detached fakes, then G through a frozen D."""
    from gan_accel.engine.schedules import warmup_then_decay
    from gan_accel.objectives.losses import LOSSES

    device = run.device
    loss = LOSSES["nonsaturating"]
    G, D = tiny_models()
    G.to(device), D.to(device)
    opt_G = torch.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)
    opt_D = torch.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)
    multiplier = warmup_then_decay(steps, int(warmup_ratio * steps), "linear")
    sched_G, sched_D = (torch.optim.lr_scheduler.LambdaLR(o, multiplier) for o in (opt_G, opt_D))
    for step in range(steps):
        real = images[step * b:(step + 1) * b].to(device)
        fake = G(latents(b, device))
        opt_D.zero_grad()
        loss.d_loss(D(real), D(fake.detach())).backward()
        if clip_D:
            torch.nn.utils.clip_grad_norm_(D.parameters(), clip_D)
        opt_D.step()
        sched_D.step()
        opt_G.zero_grad()
        for p in D.parameters():
            p.requires_grad_(False)
        loss.g_loss(D(fake)).backward()
        for p in D.parameters():
            p.requires_grad_(True)
        opt_G.step()
        sched_G.step()
    return cpu_state(G), cpu_state(D)


def sec_twin(run: Run, s: Section, report: Report) -> None:
    steps, b, tolerance = 5, 8, 1e-12
    images = tiny_images(steps * b)
    with proof_mode(run):
        trainer = make_trainer(run, "twin", *tiny_models(), loader(images, b), latents=TableLatents(Z_TINY),
                               max_steps=steps, lr_G=1e-2, lr_D=1e-2, warmup_ratio=0.4, clip_grad_norm_D=0.5)
        trainer.fit()
        twin_G, twin_D = plain_tiny_twin(run, images, b, steps, TableLatents(Z_TINY), lr=1e-2, warmup_ratio=0.4,
                                         clip_D=0.5)
    for net, twin in (("G", twin_G), ("D", twin_D)):
        diff = max_diff(cpu_state(trainer.networks[net]), twin)
        s.number(f"max |diff| {net}", diff)
        s.check(f"{net} = the hand-written loop's {net}", diff <= tolerance, f"max |diff| {diff:.2e} (tolerance {tolerance:g})")
    s.note(f"float64 tiny networks, {steps} steps of batch {b}, fused Adam on both sides, linear warmup (40%) then "
           "decay, D clipped at 0.5: the same operations in the same order on the same device, the only difference "
           "Accelerate's loss / 1.")
    s.number("summary", f"engine = plain loop, max |diff| {max(s.numbers['max |diff| G'], s.numbers['max |diff| D']):.1e}")


# -- exact resume ---------------------------------------------------------------------------------
def _resume_trainer(run: Run, folder: Path, width: int, init_seed: int = 0) -> Any:
    from gan_accel import GANTrainer, TrainConfig

    reset_accelerate()
    G, D = small_dcgan(width, seed=init_seed)
    images = digit_images(40)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=4, shuffle=True, drop_last=True)
    config = TrainConfig(max_steps=8, batch_size=4, grad_accum_steps=2, z_dim=8, ema_decay=0.9, r1_gamma=1.0, r1_every=2,
                         log_every=1, sample_every=4, checkpoint_every=3, num_samples=4, warmup_ratio=0.25,
                         output_dir=str(folder), progress_bar=False)
    return GANTrainer(G, D, data, config)


def _resume_snapshot(trainer: Any) -> dict:
    return {"G": cpu_state(trainer.G), "D": cpu_state(trainer.D), "opt_G": optimizer_tensors(trainer.opt_G),
            "opt_D": optimizer_tensors(trainer.opt_D), "ema": cpu_state(trainer.ema.module)}


def _rows_without_time(trainer: Any) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "images/s"} for row in metric_rows(trainer)]


def _saved_rng_states(folder: Path) -> dict:
    """The random states Accelerate saved in the run's step-3 checkpoint (the process-0 file)."""
    return torch.load(folder / "checkpoints" / "checkpoint_00000003" / "random_states_0.pkl", weights_only=False)


class CudaRngAtStart:
    """The CUDA generator's state when fit starts (after a resume has restored it)."""

    name = "gpu_check_cuda_rng"

    def __init__(self) -> None:
        self.state: torch.Tensor | None = None

    def on_fit_start(self, trainer: Any) -> None:
        self.state = torch.cuda.get_rng_state(trainer.accelerator.device).clone()


def _straight_and_resumed(run: Run, width: int, tag: str) -> tuple[dict, dict, Any, Any, Any]:
    straight = _resume_trainer(run, run.folder(f"straight_{tag}"), width)
    straight.fit()
    folder = run.folder(f"resumed_{tag}")
    _resume_trainer(run, folder, width).fit(stop_at_step=3)
    # read now: the resumed run's later checkpoints prune this one (keep_checkpoints=2)
    rng_states = _saved_rng_states(folder)
    torch.manual_seed(1234)  # a shifted global RNG and other initial weights: all must come from the checkpoint
    resumed = _resume_trainer(run, folder, width, init_seed=99)
    rng = CudaRngAtStart() if run.cuda else None
    if rng is not None:
        resumed.callbacks.add(rng)
    resumed.fit(resume_from="latest")
    if rng is not None:
        rng.saved = rng_states
    return _resume_snapshot(straight), _resume_snapshot(resumed), straight, resumed, rng


def sec_resume(run: Run, s: Section, report: Report) -> None:
    width = run.size(16, 4)
    s.note(f"DCGAN width {width} with BatchNorm, shuffled data, accumulation 2, lazy R1 every 2, EMA 0.9, warmup, "
           "noise from the run's own sampler on the device; 8 steps straight against 3 + checkpoint + resume "
           "(new trainer, other initial weights, shifted global RNG) + 5.")
    with proof_mode(run):
        a, b, straight, resumed, rng = _straight_and_resumed(run, width, "det")
    s.check("weights, Adam states and EMA bitwise equal" + (" (deterministic algorithms)" if run.cuda else ""),
            identical(a, b), f"max |diff| G {max_diff(a['G'], b['G']):.2e}, D {max_diff(a['D'], b['D']):.2e}")
    s.check("metrics rows equal (images/s aside)", _rows_without_time(straight) == _rows_without_time(resumed),
            f"{len(_rows_without_time(resumed))} rows")
    final = lambda t: (Path(t.config.output_dir) / "samples_final.png").read_bytes()  # noqa: E731
    s.check("final sample grid bytes equal", final(straight) == final(resumed))
    if run.cuda:
        states = rng.saved
        saved = states.get("torch_cuda_manual_seed")
        s.check("the checkpoint holds the CUDA generator's state", saved is not None, f"keys: {sorted(states)}")
        # informational: the bitwise check above is the proof (the noise comes from the CUDA generator)
        s.number("CUDA generator state at the resumed fit's start = the checkpoint's", _same_cuda_state(saved, rng.state))
        s.number("summary", "bitwise resume (deterministic)")
        _resume_without_determinism(run, s, width)
        _cuda_rng_not_restored(run, s, width)
    else:
        s.number("summary", "bitwise resume")
        s.note("CPU: the CUDA RNG checks (saved, restored, a failed restore noticed) run on CUDA only.")


def _same_cuda_state(saved: Any, state: torch.Tensor | None) -> bool:
    """Whether a checkpoint's ``torch_cuda_manual_seed`` (one state, or one per device) is ``state``."""
    saved = saved[0] if isinstance(saved, (list, tuple)) and saved else saved
    return isinstance(saved, torch.Tensor) and state is not None and torch.equal(saved.cpu(), state.cpu())


def _resume_without_determinism(run: Run, s: Section, width: int) -> None:
    """Informational: is the resume still bitwise with cuDNN/cuBLAS free to pick nondeterministic kernels?"""
    with proof_mode(run, deterministic=False):
        a, b, straight, resumed, _ = _straight_and_resumed(run, width, "free")
    same = identical(a, b)
    s.number("bitwise without deterministic algorithms (TF32 off)", same)
    s.note("Without torch.use_deterministic_algorithms / cudnn.deterministic the resumed run is "
           + ("still bitwise equal here." if same else
              f"NOT bitwise equal (max |diff| G {max_diff(a['G'], b['G']):.2e}): exact resume on CUDA needs "
              "deterministic algorithms (say so in the README's resume section)."))


def _cuda_rng_not_restored(run: Run, s: Section, width: int) -> None:
    """A resume whose CUDA RNG restore silently fails (as Accelerate only logs it): does the engine notice?"""
    from gan_accel import CheckpointError

    folder = run.folder("rng_not_restored")
    with proof_mode(run):
        _resume_trainer(run, folder, width).fit(stop_at_step=3)
        saved = _saved_rng_states(folder).get("torch_cuda_manual_seed")
        trainer = _resume_trainer(run, folder, width)
        rng = CudaRngAtStart()
        trainer.callbacks.add(rng)
        originals = torch.cuda.set_rng_state, torch.cuda.set_rng_state_all
        torch.cuda.set_rng_state = lambda *a, **k: None
        torch.cuda.set_rng_state_all = lambda *a, **k: None
        refused = None
        try:
            trainer.fit(resume_from="latest")
            refused = False
        except CheckpointError as error:
            refused = True
            s.note(f"failed CUDA RNG restore refused: {str(error).splitlines()[0]}")
        finally:
            torch.cuda.set_rng_state, torch.cuda.set_rng_state_all = originals
    s.number("a failed CUDA RNG restore is refused", refused)
    if refused:
        return
    if _same_cuda_state(saved, rng.state):
        s.note("could not make the CUDA RNG restore fail (Accelerate restored it by another call than "
               "torch.cuda.set_rng_state[_all]): whether the engine notices a failed restore is untested here")
        return
    s.finding("a failed CUDA RNG restore goes unnoticed",
              "with torch.cuda.set_rng_state[_all] made no-ops during the resume (Accelerate only logs a failed RNG "
              "restore, at INFO), fit(resume_from='latest') continued with a CUDA generator state other than the "
              "checkpoint's, hence other noise: gan_accel.storage.checkpoint.check_rng_restored compares the CPU "
              "generator only (DESIGN.md fact 15: 'With CUDA, the noise comes from the CUDA generator: check that "
              "one too').")
