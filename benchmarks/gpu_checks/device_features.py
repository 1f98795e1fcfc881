"""Sections on the device itself: the environment, channels_last, torch.compile (R1 eager), a checkpoint
written on the device and sampled by a process without a GPU, and the Evaluator callback on the device."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .fixtures import (TableLatents, Run, child_env, cpu_state, digit_images, first_conv, identical, loader,
                       make_trainer, metric_rows, proof_mode, reset_accelerate, small_dcgan)
from .report import Report, Section


def sec_env(run: Run, s: Section, report: Report) -> None:
    import accelerate

    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "accelerate": accelerate.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(run.device), "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "quick": run.quick,
    }
    if run.cuda:
        props = torch.cuda.get_device_properties(run.device)
        env.update(device_name=torch.cuda.get_device_name(run.device), capability=".".join(map(str, props.major_minor))
                   if hasattr(props, "major_minor") else f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2**30, 1), bf16_supported=torch.cuda.is_bf16_supported(),
                   device_count=torch.cuda.device_count(),
                   cublas_workspace_config=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                   proof_settings="TF32 off (matmul and cuDNN), cudnn.deterministic=True, cudnn.benchmark=False, "
                                  "torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8",
                   speed_settings=f"defaults: matmul TF32 {torch.backends.cuda.matmul.allow_tf32}, cuDNN TF32 "
                                  f"{torch.backends.cudnn.allow_tf32}, cudnn.benchmark {torch.backends.cudnn.benchmark}")
    else:
        env.update(device_name=f"CPU ({env['cpu']}, {os.cpu_count()} logical)", bf16_supported=True,
                   proof_settings="CPU: deterministic for a fixed thread count")
    report.environment = env
    for key, value in env.items():
        s.number(key, value)
    s.number("summary", f"{env['device_name']}, torch {env['torch']}, accelerate {env['accelerate']}")
    s.check("the device Accelerate will use is the one asked for", _accelerate_device(run) == run.device.type,
            f"Accelerate's device: {_accelerate_device(run)}")


def _accelerate_device(run: Run) -> str:
    from accelerate import PartialState

    reset_accelerate()
    device = PartialState().device.type
    reset_accelerate()
    return device



# -- channels_last and compile ---------------------------------------------------------------------------
def _sgd_dcgan_run(run: Run, name: str, width: int, steps: int, callbacks: tuple = (), hook: bool = False,
                   **settings: Any) -> tuple[Any, list]:
    G, D = small_dcgan(width)
    outputs: list[torch.Tensor] = []
    trainer = make_trainer(run, name, G, D, loader(digit_images(8 * steps), 8), latents=TableLatents(8, dtype=torch.float32),
                           max_steps=steps, z_dim=8, opt_G=torch.optim.SGD(G.parameters(), lr=0.01),
                           opt_D=torch.optim.SGD(D.parameters(), lr=0.01), callbacks=callbacks, **settings)
    if hook:  # after the preflight, which runs before the networks are converted
        first_conv(trainer).register_forward_hook(lambda m, i, o: outputs.append(o.detach()))
    start = time.perf_counter()
    trainer.fit()
    trainer.fit_seconds = time.perf_counter() - start
    return trainer, outputs


def _compare_runs(s: Section, label: str, reference: Any, other: Any, rtol: float, atol: float) -> None:
    worst = 0.0
    for net in ("G", "D"):
        a, b = cpu_state(reference.networks[net]), cpu_state(other.networks[net])
        for key in a:
            if a[key].is_floating_point():
                excess = ((b[key].double() - a[key].double()).abs() - rtol * a[key].double().abs()).max().item()
                worst = max(worst, excess)
    s.number(f"{label}: max (|diff| - rtol |x|)", worst)
    s.check(f"{label}: weights match the eager run", worst <= atol,
            f"|diff| <= {rtol:g} |x| + {atol:g} (SGD lr 0.01: a wrong gradient moves weights by ~1e-3)")
    rows_a, rows_b = metric_rows(reference), metric_rows(other)
    close = len(rows_a) == len(rows_b) and all(math.isclose(x[k], y[k], rel_tol=1e-3, abs_tol=1e-5)
                                               for x, y in zip(rows_a, rows_b) for k in ("loss/D", "loss/G"))
    s.check(f"{label}: losses match the eager run's, row by row (rel 1e-3)", close)


def sec_channels_last(run: Run, s: Section, report: Report) -> None:
    width, steps = run.size(16, 4), 4
    with proof_mode(run):
        eager, _ = _sgd_dcgan_run(run, "eager", width, steps)
        fast, outputs = _sgd_dcgan_run(run, "channels_last", width, steps, hook=True, channels_last=True)
    weights = [p for net in (fast.G, fast.D) for p in net.parameters() if p.dim() == 4]
    s.check("conv weights on the device in channels_last", bool(weights) and all(
        p.is_contiguous(memory_format=torch.channels_last) and p.device.type == run.device.type for p in weights),
        f"{len(weights)} conv weights")
    s.check("D's first convolution outputs channels_last", bool(outputs) and all(
        o.is_contiguous(memory_format=torch.channels_last) for o in outputs), f"{len(outputs)} calls")
    _compare_runs(s, "channels_last", eager, fast, rtol=1e-4, atol=1e-5)
    s.number("summary", "channels_last trains in channels_last and matches eager")


def sec_compile(run: Run, s: Section, report: Report) -> None:
    width, steps = run.size(16, 4), 4
    backend_patch = contextlib.nullcontext()
    if not run.cuda and run.quick:
        original = torch.compile
        backend_patch = _patched(torch, "compile", functools.partial(original, backend="eager"))
        s.note("CPU --quick: torch.compile with backend='eager' (dynamo traces and guards, no inductor code "
               "generation, which takes minutes on a small CPU); the real inductor path runs on CUDA and without --quick.")
    with proof_mode(run, deterministic=False):  # inductor's kernels need not be deterministic
        eager, _ = _sgd_dcgan_run(run, "eager", width, steps, r1_gamma=1.0, r1_every=2)
        with backend_patch:
            compiled, _ = _sgd_dcgan_run(run, "compiled", width, steps, r1_gamma=1.0, r1_every=2, compile=True)
    s.note("TF32 off; deterministic algorithms off here (inductor's generated kernels do not promise them).")
    views = compiled.runner.nets
    s.check("the runner trains through compiled G and D", all(type(views[n]).__name__ == "OptimizedModule" for n in ("G", "D")))
    s.check("the trainer's own networks stay eager (checkpoints, EMA, sampling)",
            not any(type(n).__name__ == "OptimizedModule" for n in compiled.networks.values()))
    s.check("the lazy R1 phase ran (eagerly: a double backward through a compiled D would raise)",
            compiled.runner.phase_runs.get("R1") == eager.runner.phase_runs.get("R1") == steps // 2,
            f"R1 runs {compiled.runner.phase_runs.get('R1')}")
    _compare_runs(s, "compile", eager, compiled, rtol=1e-4, atol=1e-5)
    s.number("compiled run, s (compilation included)", round(compiled.fit_seconds, 1))
    s.number("eager run, s", round(eager.fit_seconds, 1))
    s.number("summary", f"compile + eager R1 matches eager; compiled run {compiled.fit_seconds:.0f} s")


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


# -- a checkpoint written on the device, sampled on a CPU -------------------------------------------------
SAMPLER = """
import sys, torch
assert not torch.cuda.is_available(), "this process must not see a GPU"
from gan_accel.cli import main
code = main(["sample", sys.argv[1], "--out", sys.argv[3], "--num", "16", "--seed", "3"])
code = code or main(["sample", sys.argv[2], "--out", sys.argv[4], "--num", "16", "--seed", "3", "--no-ema"])
sys.exit(code)
"""


def sec_checkpoint(run: Run, s: Section, report: Report) -> None:
    import numpy as np

    from gan_accel import load_generator

    width, steps, z_dim = run.size(16, 4), 4, 8
    model = {"family": "dcgan", "z_dim": z_dim, "width": width, "image_size": 28, "channels": 1, "num_classes": None}
    with proof_mode(run):
        trainer = make_trainer(run, "written_on_device", *small_dcgan(width, z_dim=z_dim), loader(digit_images(64), 8),
                               quiet=False, max_steps=steps, ema_decay=0.9, sample_every=steps, z_dim=z_dim,
                               model=model)
        trainer.fit()
    folder = Path(trainer.config.output_dir)
    checkpoint = folder / "checkpoints" / f"checkpoint_{steps:08d}"
    s.check("the run wrote its generator and a checkpoint", (folder / "generator" / "model.safetensors").is_file() and checkpoint.is_dir())
    ema_npz, raw_npz = folder / "ema.npz", folder / "raw.npz"
    env = dict(child_env(), CUDA_VISIBLE_DEVICES="")
    env.pop("ACCELERATE_USE_CPU", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", SAMPLER, str(folder), str(checkpoint), str(ema_npz), str(raw_npz)],
                          env=env, capture_output=True, text=True, timeout=max(10.0, run.deadline - time.monotonic()))
    s.number("sampling process, s", round(time.perf_counter() - start, 1))
    if not s.check("`gan-accel sample` in a process without a GPU: run folder (EMA) and checkpoint (--no-ema)",
                   done.returncode == 0, (done.stderr or done.stdout).strip().splitlines()[-1] if done.returncode else ""):
        s.error = (done.stderr or done.stdout).strip().splitlines()[-1] if (done.stderr or done.stdout).strip() else ""
        return
    # The device's own samples of the same latents (sample_images: randn from a CPU generator seeded 3)
    z = torch.randn(16, z_dim, generator=torch.Generator().manual_seed(3))
    references = {"EMA": trainer.sampling_generator(), "raw G": trainer.accelerator.unwrap_model(trainer.G)}
    for (label, module), npz in zip(references.items(), (ema_npz, raw_npz)):
        G = copy.deepcopy(module).eval()
        with torch.no_grad(), proof_mode(run):
            expected = G(z.to(run.device)).float().cpu()
        got = torch.from_numpy(np.load(npz)["images"])
        diff = (got - expected).abs().max().item() if got.shape == expected.shape else math.inf
        s.number(f"{label}: max |CPU sample - device sample|", diff)
        s.check(f"{label}: the CPU process's samples = the device's for the same latents", diff <= 1e-4,
                f"max |diff| {diff:.2e} (tolerance 1e-4" + ("" if run.cuda else "; the same CPU kernels here") + ")")
    for label, source, ema, module in (("EMA", folder, True, trainer.sampling_generator()),
                                       ("raw G", checkpoint, False, trainer.accelerator.unwrap_model(trainer.G))):
        loaded = load_generator(source, ema=ema)
        s.check(f"{label}: the weights read on the CPU are the device's, bitwise",
                identical({k: v for k, v in loaded.state_dict().items()}, cpu_state(module)))
    s.number("summary", "written on the device, sampled without a GPU")


# -- the Evaluator callback on the device ----------------------------------------------------------------
def sec_evaluator(run: Run, s: Section, report: Report) -> None:
    from gan_accel.callbacks import Evaluator
    from gan_accel.eval import frechet_distance_from_features

    def pooled(x: torch.Tensor) -> torch.Tensor:  # a 16-d feature map computed wherever x is
        return F.adaptive_avg_pool2d(x.float(), 4).flatten(1).double()

    width, num, every, z_dim = run.size(16, 4), 128, 2, 8
    images = digit_images(256)
    reference = pooled(images)

    class ExpectedFD:
        """The FD the evaluator should log, computed on the CPU from a copy of the sampling G."""

        name = "gpu_check_expected_fd"

        def __init__(self) -> None:
            self.values: dict[int, float] = {}

        def on_step_end(self, trainer: Any) -> None:
            if trainer.step % every:
                return
            G = copy.deepcopy(trainer.sampling_generator()).cpu().eval()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(11)
                z = torch.randn(num, z_dim)
            with torch.no_grad():
                self.values[trainer.step] = frechet_distance_from_features(pooled(G(z)), reference)

    expected = ExpectedFD()
    evaluator = Evaluator(pooled, reference, every=every, num_samples=num, seed=11, keep_best=False)
    with proof_mode(run):
        trainer = make_trainer(run, "evaluator", *small_dcgan(width, z_dim=z_dim), loader(images, 8), max_steps=4,
                               z_dim=z_dim, ema_decay=0.9, callbacks=(expected, evaluator))
        trainer.fit()
    rows = [r for r in metric_rows(trainer) if "eval/fd" in r]
    s.check("evaluations at steps 2 and 4", [r["step"] for r in rows] == [2, 4], f"{[r['step'] for r in rows]}")
    for row in rows:
        want = expected.values.get(row["step"], math.nan)
        s.check(f"step {row['step']}: the evaluator's FD (generated on {run.device.type}) = the CPU computation",
                math.isclose(row["eval/fd"], want, rel_tol=1e-3), f"{row['eval/fd']:.6g} against {want:.6g} (rel 1e-3)")
    s.number("summary", "Evaluator on the device = CPU computation")
