"""The first-contact check on a GPU: everything only a GPU executes, proven or measured in one run.

    python benchmarks/gpu_check.py --out gpu_check_report                 # one CUDA GPU, about 8-9.5 min
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gc     # the same sections on CPU, tiny (tests)
    python benchmarks/gpu_check.py --sections fp16,guard,syncs --out gc   # some sections only

Writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` after every section, so a run that is
killed still leaves a report. Sections run in order, each under a time budget, all under a global
deadline (``--deadline``, 9.5 min on CUDA): a section that would not fit in the time left is reported
"not run: out of time"; one that fails (an exception, or a check that does not hold) is reported with
the error's first line and never stops the others.

Every section reports ``pass``, ``fail``, ``skipped`` (with the reason) or ``not run``, its checks, its
numbers and its *findings*: behaviour of the engine that differs from what its docs or DESIGN.md
say, reported for the lead to decide (they do not fail the section; this script never changes the
engine). Speed targets are reported as met / not met and do not fail a section either.

The correctness sections build their reference independently, in plain PyTorch inside this script
(a hand-written twin loop, a larger batch, an uninterrupted run, a closed-form penalty), and use the
engine only through its public API. On CUDA they run with TF32 off, ``torch.backends.cudnn``
deterministic and ``torch.use_deterministic_algorithms(True, warn_only=True)`` (``CUBLAS_WORKSPACE_CONFIG=:4096:8``,
set by this script before cuBLAS starts), so that "the same computation on the same device" can be
compared bit for bit; the resume section also says whether it is still bitwise without them.

Sections (``--sections``; all by default, in this order):

* ``env``: torch, accelerate, CUDA, device name, capability, bf16 support, the settings the proofs use.
* ``recipe``: first, the published 64-px recipe's first minutes: ``gan-accel train --data D --resolution 64
  --max-time 120`` with nothing else (the recipe table picks the rest: R3GAN's recipe on a GPU) on 2,000
  coloured digits (``make_rgb_digits.py``, MNIST from ``--data-dir``): the recipe and model lines it
  printed, steps, images/s, whether every logged loss is finite, skipped updates (fails above 10% of
  steps); its last grid, loss curves and metrics come back as ``recipe_64px.png``, ``recipe_64px_plot.png``
  and ``recipe_64px_metrics.jsonl``. CPU ``--quick``: 40 images, 4 steps at width 4 (the CPU row, dcgan).
* ``accumulation``: k micro-batches of b with accumulation k = one batch of k*b (float64, tolerance 1e-10).
* ``twin``: N engine steps = N steps of a hand-written loop on the device (float64, warmup, clipping).
* ``resume``: k steps + checkpoint + resume + N-k = N straight, bitwise (BatchNorm DCGAN, accumulation 2,
  lazy R1, EMA, noise from the device's generator); CUDA: the CUDA RNG state is restored, and whether the
  engine notices when it is not.
* ``fp16``: Accelerate's one GradScaler shared by both optimizers: a forced overflow in one D update skips
  exactly that update (weights and Adam state bitwise unchanged), G's update of the same step happens, the
  scale halves once, the skip is counted (skipped_fp16/D) and
  uses up its step of the schedule whatever the optimizer; and an fp16 run with clipping of D = a plain loop
  with its own GradScaler. On CPU Accelerate turns fp16 off (no autocast, no scaler): this section switches
  both on (fp16 autocast runs on CPU, and a CPU GradScaler) so the engine's fp16 paths still run.
* ``bf16``: bf16 autocast (convolutions really in bf16) = a plain bf16 loop.
* ``penalties``: R1 and WGAN-GP under fp16 loss scaling against closed forms (a linear D): the logged
  penalty and D's update (scaled, then unscaled once); and what happens at Accelerate's default scale 2^16.
* ``guard``: the divergence guard on the device: NaN loss and NaN gradients skip exactly their update
  (weights and optimizer state bitwise), counted on the device; DivergenceError at the next log row;
  under fp16 a NaN loss becomes the scaler's skip.
* ``channels_last``, ``compile``: they train, match the eager run (SGD, so that a parameter difference is
  a gradient difference), and compile runs the lazy R1 phase eagerly. CPU ``--quick``: dynamo with the
  "eager" backend (no inductor code generation, which takes minutes on a small CPU). ``compile`` runs last.
* ``checkpoint``: a run written on the device, sampled by ``gan-accel sample`` in a process that sees no
  GPU (``CUDA_VISIBLE_DEVICES=""``): the weights bitwise, the images against the device's own.
* ``evaluator``: the Evaluator callback on the device logs the FD an independent CPU computation gives.
* ``syncs``: host-device synchronisations per step outside log rows (``torch.cuda.set_sync_debug_mode``),
  with the code lines that caused them; the plain loop's for comparison. CPU: n/a.
* ``engine_vs_plain``: GANTrainer against the hand-written loop, same models and optimizers, blocks of
  steps alternating in one process (DCGAN 64 px, width 64, batch 256, bf16 on CUDA); target >= 0.97x.
* ``memory``: peak GPU memory (``max_memory_allocated``), engine against the plain loop. CPU: n/a.
* ``quickstart``: ``examples/dcgan_mnist.py`` at its defaults and with the fast options (bf16,
  channels_last, compile, batch 256 with the learning rate scaled by sqrt(4)): wall time, images/s,
  the MNIST scores (``--eval``). MNIST is read from ``--data-dir`` (no download on a GPU machine
  without network: without it the example trains on its offline digits and says so).

Deterministic algorithms are switched on with ``warn_only=True``: an op without a deterministic CUDA
kernel is named in its section's notes instead of stopping the section.

Single process only: the multi-GPU parts (DDP with ``broadcast_buffers=False`` and BatchNorm, the
asynchronous stop flag) need two GPUs and are listed as not covered in the report.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(ROOT), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import engine_overhead  # noqa: E402  (benchmarks/: the benchmarks' quiet trainer and in-memory loader)
from make_rgb_digits import make_rgb_digits  # noqa: E402  (benchmarks/: the coloured digits, offline)

REPORT_JSON, REPORT_MD = "gpu_check.json", "gpu_check.md"
QUIET = ("sample_saver", "training_plot", "checkpointer", "weights_exporter", "progress_bar", "signal_handler")  # no files, as the benchmarks run
NOT_COVERED = [
    "DDP with BatchNorm and broadcast_buffers=False, and the asynchronous stop flag: they need 2 processes "
    "with a GPU each (NCCL refuses two ranks on one GPU); run tests/test_distributed.py's scenarios under "
    "`accelerate launch --multi_gpu --num_processes 2` on a 2-GPU machine",
]


# ================================================================================================
# The report
# ================================================================================================
class Skip(Exception):
    """A section that cannot run here, with the reason."""


class SectionTimeout(Exception):
    """A section ran past its time budget."""


@dataclass
class Section:
    """One section's result, filled in while it runs."""

    name: str
    title: str
    status: str = "not run"  # pass, fail, skipped, not run
    reason: str = ""
    seconds: float = 0.0
    checks: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    traceback: str = ""

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a check that must hold; returns ``ok``."""
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    def finding(self, name: str, detail: str) -> None:
        """Record engine behaviour that differs from its documentation: for the lead, not a failure here."""
        self.findings.append({"name": name, "detail": detail})

    def target(self, name: str, value: float, minimum: float, detail: str = "") -> None:
        self.targets.append({"name": name, "value": value, "minimum": minimum, "met": value >= minimum,
                             "detail": detail})

    def number(self, key: str, value: Any) -> None:
        self.numbers[key] = value

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def failed_checks(self) -> list[dict]:
        return [c for c in self.checks if not c["ok"]]


class Report:
    """The JSON and Markdown report, rewritten after every section."""

    def __init__(self, out: Path, options: dict) -> None:
        self.out = out
        self.options = options
        self.environment: dict[str, Any] = {}
        self.sections: list[Section] = []
        self.started = time.time()
        self.finished = False

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"options": self.options, "environment": self.environment, "started": _stamp(self.started),
                "elapsed_s": round(time.time() - self.started, 1), "finished": self.finished,
                "not_covered": NOT_COVERED, "sections": [vars(s) for s in self.sections]}
        _atomic_write(self.out / REPORT_JSON, json.dumps(data, indent=2, default=_jsonable) + "\n")
        _atomic_write(self.out / REPORT_MD, self.markdown())

    def markdown(self) -> str:
        env = self.environment
        lines = ["# gan_accel GPU check", "",
                 f"{env.get('device_name', '?')} ({self.options.get('device')}{', quick' if self.options.get('quick') else ''}); "
                 f"torch {env.get('torch', '?')}, accelerate {env.get('accelerate', '?')}, CUDA {env.get('cuda', '-')}; "
                 f"started {_stamp(self.started)}, {time.time() - self.started:.0f} s"
                 f"{'' if self.finished else ' so far (the run did not finish)'}", "",
                 "| section | status | time, s | checks | findings | targets | summary |",
                 "| --- | --- | ---: | ---: | ---: | --- | --- |"]
        for s in self.sections:
            checks = f"{len(s.checks) - len(s.failed_checks)}/{len(s.checks)}" if s.checks else "-"
            targets = ", ".join("met" if t["met"] else "NOT met" for t in s.targets) or "-"
            short = s.reason.split(": ")[0].split(" (")[0]  # the whole reason is in the section below
            status = s.status + (f": {short}" if s.reason and s.status in ("skipped", "not run") else "")
            lines.append(f"| {s.name} | {status} | {s.seconds:.1f} | {checks} | {len(s.findings) or '-'} | {targets} | "
                         f"{_md_cell(s.numbers.get('summary', s.error))} |")
        lines += ["", "Not covered by a one-GPU run: " + " ".join(NOT_COVERED), ""]
        for s in self.sections:
            lines += [f"## {s.name}: {s.title}", "", f"**{s.status}**" + (f": {s.reason}" if s.reason else "")
                      + f" ({s.seconds:.1f} s)", ""]
            if s.error:
                lines += [f"Error: `{s.error}`", ""]
            for c in s.checks:
                lines.append(f"- [{'x' if c['ok'] else ' '}] {c['name']}" + (f": {c['detail']}" if c["detail"] else "")
                             + ("" if c["ok"] else "  **FAILED**"))
            for f_ in s.findings:
                lines.append(f"- [!] finding: {f_['name']}: {f_['detail']}")
            for t in s.targets:
                lines.append(f"- target {t['name']}: {t['value']:.3f} against >= {t['minimum']} "
                             f"({'met' if t['met'] else 'NOT met'}){': ' + t['detail'] if t['detail'] else ''}")
            if s.checks or s.findings or s.targets:
                lines.append("")
            numbers = {k: v for k, v in s.numbers.items() if k != "summary"}
            if numbers:
                lines += ["| number | value |", "| --- | --- |"]
                lines += [f"| {_md_cell(k)} | {_md_cell(_fmt(v))} |" for k, v in numbers.items()]
                lines.append("")
            lines += [f"- {n}" for n in s.notes]
            if s.notes:
                lines.append("")
        return "\n".join(lines) + "\n"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=_jsonable)
    return str(value)


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return repr(value)


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


# ================================================================================================
# The run: options, sizes, the device, and what every section shares
# ================================================================================================
@dataclass
class Run:
    """What a section needs: the device, the sizes, folders, the clock."""

    device: torch.device
    quick: bool
    out: Path
    work: Path
    data_dir: str
    deadline: float
    fast_batch: int
    fast_lr: float | None
    repeats: int
    _counter: int = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def folder(self, name: str) -> Path:
        """A fresh folder for one trainer's run."""
        self._counter += 1
        return self.work / f"{self._counter:02d}_{name}"

    def size(self, cuda: Any, cpu: Any, cuda_quick: Any = None, cpu_quick: Any = None) -> Any:
        """The value for this device and mode (quick defaults to the full value)."""
        if self.cuda:
            return cuda_quick if self.quick and cuda_quick is not None else cuda
        return cpu_quick if self.quick and cpu_quick is not None else cpu

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


NONDETERMINISTIC: list[str] = []  # warnings of ops that have no deterministic implementation (proof_mode)


def reset_accelerate() -> None:
    """Accelerate's process-wide singletons: each trainer of this process needs fresh ones."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@contextlib.contextmanager
def proof_mode(run: Run, deterministic: bool = True):
    """The settings under which "the same computation on the same device" is compared bit for bit:
    TF32 off, cuDNN deterministic without autotuning, deterministic algorithms (CUDA only; CPU kernels
    here are deterministic for a fixed thread count)."""
    if not run.cuda:
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for w in caught:  # ops without a deterministic CUDA implementation: named in the section's notes
            text = str(w.message)
            if "deterministic" in text and text not in NONDETERMINISTIC:
                NONDETERMINISTIC.append(text)
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
         torch.backends.cudnn.benchmark) = saved[:4]
        torch.use_deterministic_algorithms(saved[4])


# -- models, data, latents -----------------------------------------------------------------------
Z_TINY, IMAGE_TINY = 4, (1, 4, 4)


class TinyG(nn.Module):
    """BatchNorm-free generator: per-sample maths, so a batch splits exactly into micro-batches."""

    def __init__(self) -> None:
        super().__init__()
        self.z_dim = Z_TINY
        self.net = nn.Sequential(nn.Linear(Z_TINY, 16), nn.LeakyReLU(0.2), nn.Linear(16, 16), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).reshape(z.shape[0], *IMAGE_TINY)


class TinyD(nn.Module):
    """BatchNorm-free discriminator, one logit per image."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).reshape(x.shape[0])


class LinearD(nn.Module):
    """D(x) = w . x + b: its input gradient is w everywhere, so R1 and WGAN-GP have closed forms."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.linear = nn.Linear(weight.numel(), 1)
        with torch.no_grad():
            self.linear.weight.copy_(weight.reshape(1, -1))
            self.linear.bias.fill_(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1)).reshape(x.shape[0])


def tiny_models(dtype: torch.dtype = torch.float64, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    return TinyG().to(dtype), TinyD().to(dtype)


def small_dcgan(width: int, seed: int = 0, z_dim: int = 8) -> tuple[nn.Module, nn.Module]:
    """A 28x28 DCGAN with BatchNorm, float32."""
    from gan_accel.models import DCGANDiscriminator, DCGANGenerator

    torch.manual_seed(seed)
    return DCGANGenerator(z_dim=z_dim, width=width, image_size=28), DCGANDiscriminator(width=width, image_size=28)


def tiny_images(n: int, dtype: torch.dtype = torch.float64, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, *IMAGE_TINY, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2 - 1


def digit_images(n: int, seed: int = 3) -> torch.Tensor:
    """(n, 1, 28, 28) float32 in [-1, 1]: smooth random blobs (enough for losses to move)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(n, 1, 7, 7, generator=g)
    return (F.interpolate(low, size=28, mode="bilinear", align_corners=False) * 2 - 1).clamp(-1, 1)


def loader(images: torch.Tensor, batch: int, shuffle: bool = False) -> torch.utils.data.DataLoader:
    """Unshuffled by default, so batch i is images[i*b:(i+1)*b] for any b."""
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=batch, shuffle=shuffle,
                                       drop_last=True)


class TableLatents:
    """Latents read in order from a fixed table: the engine and a twin loop draw the same ones."""

    def __init__(self, z_dim: int, rows: int = 8192, dtype: torch.dtype = torch.float64, seed: int = 7) -> None:
        self.flat = torch.randn(rows, z_dim, generator=torch.Generator().manual_seed(seed), dtype=dtype)
        self.cursor = 0

    def rewind(self) -> "TableLatents":
        self.cursor = 0
        return self

    def __call__(self, batch: int, device: torch.device) -> torch.Tensor:
        rows = self.flat[self.cursor:self.cursor + batch]
        if rows.shape[0] < batch:
            raise RuntimeError("latent table exhausted")
        self.cursor += batch
        return rows.to(device)


def make_trainer(run: Run, name: str, G: nn.Module, D: nn.Module, data: Any, *, latents: TableLatents | None = None,
                 quiet: bool = True, callbacks: tuple = (), accelerator: Any = None, **settings: Any):
    """A GANTrainer on a fresh Accelerate state and folder; ``settings`` are TrainConfig fields."""
    from gan_accel import GANTrainer, TrainConfig

    reset_accelerate()
    extra = {key: settings.pop(key) for key in ("phases", "opt_G", "opt_D", "extra_networks") if key in settings}
    config = dict(max_steps=4, batch_size=data.batch_size, z_dim=getattr(G, "z_dim", 8), log_every=1,
                  sample_every=10**6, checkpoint_every=10**6, num_samples=4, warmup_ratio=0.0,
                  output_dir=str(run.folder(name)), progress_bar=False)
    config.update(settings)
    config = TrainConfig(**config)
    if callable(accelerator):
        accelerator = accelerator(config)
    trainer = GANTrainer(G, D, data, config, accelerator=accelerator, latent_sampler=latents, callbacks=list(callbacks),
                         disable_callbacks=QUIET if quiet else (), **extra)
    if latents is not None:
        latents.rewind()  # the preflight drew from the table
    return trainer


def fp16_accelerator(run: Run, init_scale: float | None = None) -> Callable[[Any], Any]:
    """An Accelerator for ``TrainConfig(mixed_precision="fp16")``: on CUDA Accelerate's own (its GradScaler
    replaced by one with ``init_scale`` if given); on CPU, where Accelerate silently turns fp16 off, the
    same with fp16 autocast and a CPU GradScaler switched on, so the engine's fp16 paths run."""
    from gan_accel import build_accelerator

    def build(config: Any) -> Any:
        accelerator = build_accelerator(config)
        kwargs = {} if init_scale is None else {"init_scale": init_scale}
        if run.cuda:
            if accelerator.scaler is None:
                raise RuntimeError("Accelerate made no GradScaler for fp16 on CUDA")
            if kwargs:
                accelerator.scaler = torch.amp.GradScaler("cuda", **kwargs)
        else:
            accelerator.native_amp = True  # autocast(cpu, float16) and the fp16 unscale path
            accelerator.scaler = torch.amp.GradScaler("cpu", **kwargs)
        return accelerator

    return build


def cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    from accelerate.utils import extract_model_from_parallel

    return {k: v.detach().clone().cpu() for k, v in extract_model_from_parallel(module).state_dict().items()}


def parameters_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters only (BatchNorm's running statistics move in every forward, update or not)."""
    from accelerate.utils import extract_model_from_parallel

    return {k: v.detach().clone().cpu() for k, v in extract_model_from_parallel(module).named_parameters()}


def optimizer_tensors(optimizer: Any) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optimizer", optimizer)
    return [t.detach().clone().cpu() for group in inner.param_groups for p in group["params"]
            for t in inner.state.get(p, {}).values() if isinstance(t, torch.Tensor)]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference over matching floating-point tensors (inf if the keys differ)."""
    if a.keys() != b.keys():
        return math.inf
    diffs = [(a[k].double() - b[k].double()).abs().max().item() for k in a
             if a[k].is_floating_point() and a[k].numel()]
    return max(diffs, default=0.0)


def identical(a: Any, b: Any) -> bool:
    """Bitwise (torch.equal) equality of nested tensors, dicts, lists."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    return a == b


def metric_rows(trainer: Any) -> list[dict]:
    from gan_accel.callbacks.metrics_log import read_metrics

    path = Path(trainer.config.output_dir) / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def count_inner_steps(trainer: Any) -> dict[str, int]:
    """Counts the torch optimizers' real steps (Accelerate skips none here: every window ends synced)."""
    counts = {"G": 0, "D": 0}
    for name in counts:
        inner = getattr(trainer.optimizers[name], "optimizer", trainer.optimizers[name])
        original = inner.step

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        inner.step = counted
    return counts


class RecordUpdates:
    """After every phase: the network's weights and optimizer state, the loss scale, the scheduler's ticks."""

    name = "gpu_check_record"

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_phase_end(self, trainer: Any, phase: Any) -> None:
        scaler = trainer.accelerator.scaler
        scheduler = trainer.schedulers[phase.net]
        self.rows.append({"step": trainer.step, "phase": phase.name, "net": phase.net,
                          "params": parameters_of(trainer.networks[phase.net]),
                          "state": optimizer_tensors(trainer.optimizers[phase.net]),
                          "scale": None if scaler is None else float(scaler.get_scale()),
                          "ticks": getattr(scheduler, "scheduler", scheduler).last_epoch,
                          "lr": trainer.optimizers[phase.net].param_groups[0]["lr"]})

    def of(self, net: str) -> list[dict]:
        return [r for r in self.rows if r["net"] == net]


def first_conv(trainer: Any) -> nn.Module:
    """D's first convolution, in the prepared D the runner calls (the compiled view shares it)."""
    return trainer.accelerator.unwrap_model(trainer.D).net[0]


def moved(before: dict, after: dict) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before if before[k].is_floating_point())


# ================================================================================================
# Sections
# ================================================================================================
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
    rng_states = torch.load(folder / "checkpoints" / "checkpoint_00000003" / "random_states_0.pkl", weights_only=False)
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
        saved = torch.load(folder / "checkpoints" / "checkpoint_00000003" / "random_states_0.pkl",
                           weights_only=False).get("torch_cuda_manual_seed")
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


# -- fp16: one GradScaler, two optimizers ---------------------------------------------------------------
class OverflowingGradient(torch.autograd.Function):
    """Identity forward (the loss stays finite: the divergence guard does not see it), backward x 1e38:
    the scaled gradients overflow whatever the precision, as an fp16 overflow does."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 1e38


def d_loss_modified(at_step: int, how: str) -> list:
    """The default phases, with D's loss changed at step ``at_step`` (0-based, ``at_step="from:N"`` for every
    step from N): "overflow" (finite loss, overflowing gradients), "nan_loss" (+ NaN), "nan_grad" (NaN gradients)."""
    from gan_accel import Phase, discriminator_loss, generator_loss
    from gan_accel.objectives.losses import LOSSES

    loss = LOSSES["nonsaturating"]
    d_loss = discriminator_loss(loss)
    start = int(str(at_step).split(":")[-1])
    every = str(at_step).startswith("from:")

    def modified(ctx: Any) -> torch.Tensor:
        value = d_loss(ctx)
        if ctx.step == start or (every and ctx.step >= start):
            if how == "overflow":
                return OverflowingGradient.apply(value)
            if how == "nan_loss":
                return value + float("nan")
            if how == "nan_grad":
                return NaNGradient.apply(value)
        return value

    return [Phase("D", "D", modified, new_data=True), Phase("G", "G", generator_loss(loss))]


class NaNGradient(torch.autograd.Function):
    """Identity forward, NaN backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


def _fp16_overflow_run(run: Run, optimizer: str, width: int, steps: int, at: int) -> tuple[Any, RecordUpdates]:
    G, D = small_dcgan(width)
    extra = {}
    if optimizer == "foreach":
        extra = dict(opt_G=torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999), foreach=True),
                     opt_D=torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999), foreach=True))
    record = RecordUpdates()
    trainer = make_trainer(run, f"fp16_overflow_{optimizer}", G, D, loader(digit_images(8 * steps), 8),
                           latents=TableLatents(8, dtype=torch.float32), callbacks=(record,), max_steps=steps,
                           mixed_precision="fp16", lr_G=1e-3, lr_D=1e-3, lr_schedule="linear", z_dim=8,
                           accelerator=fp16_accelerator(run, init_scale=256.0), phases=d_loss_modified(at, "overflow"),
                           **extra)
    record.initial = {"D": parameters_of(trainer.D), "G": parameters_of(trainer.G)}
    trainer.fit()
    return trainer, record


def sec_fp16(run: Run, s: Section, report: Report) -> None:
    width, steps, at = run.size(16, 4), 6, 2
    s.note("CUDA: fp16 autocast and Accelerate's GradScaler." if run.cuda else
           "CPU: Accelerate turns fp16 off on CPU (no autocast, no scaler); here fp16 autocast (which CPU supports) "
           "and a CPU GradScaler are switched on, so the engine's fp16 paths (shared scaler, per-optimizer unscale, "
           "scaler skips, Accelerate's optimizer and scheduler wrappers) run as on a GPU, on CPU kernels.")
    s.note(f"Forced overflow: D's loss backward x 1e38 at step {at} only (the loss itself stays finite, so only the "
           "GradScaler can see it); DCGAN with BatchNorm, linear lr decay, GradScaler init_scale 256 (so that no other "
           "update overflows by itself), growth_interval 2000 (no growth in 6 steps).")
    with proof_mode(run):
        trainer, record = _fp16_overflow_run(run, "fused", width, steps, at)
    _check_overflow(s, trainer, record, at, "fused Adam (the default)")
    rows = metric_rows(trainer)
    s.number("loss_scale per row", [r.get("loss_scale") for r in rows])
    counted = rows[-1].get("skipped_fp16/D") if rows else None
    s.check("the overflow skip is counted (skipped_fp16/D = 1, skipped_fp16/G = 0 in the last row)",
            counted == 1 and rows[-1].get("skipped_fp16/G") == 0, f"last row: skipped_fp16/D = {counted}")
    fused_ticks = record.of("D")[at]["ticks"] - record.of("D")[at - 1]["ticks"]
    with proof_mode(run):
        trainer_f, record_f = _fp16_overflow_run(run, "foreach", width, steps, at)
    _check_overflow(s, trainer_f, record_f, at, "foreach Adam (passed by the user)")
    foreach_ticks = record_f.of("D")[at]["ticks"] - record_f.of("D")[at - 1]["ticks"]
    s.number("D scheduler ticks on the skipped update: fused / foreach Adam", [fused_ticks, foreach_ticks])
    s.check("a skipped fp16 update uses up its step of the schedule, whatever the optimizer (as a guard skip does)",
            fused_ticks == foreach_ticks == 1, f"fused Adam: {fused_ticks} tick, foreach Adam: {foreach_ticks}")
    _fp16_twin(run, s, width)
    s.number("summary", f"overflow skipped exactly D@{at}; scheduler ticks fused/foreach {fused_ticks}/{foreach_ticks}; "
             f"twin max |diff| {s.numbers.get('twin max |diff|', float('nan')):.1e}")


def _check_overflow(s: Section, trainer: Any, record: RecordUpdates, at: int, label: str) -> None:
    D_rows, G_rows = record.of("D"), record.of("G")
    before_D = D_rows[at - 1]
    s.check(f"{label}: D's overflowing update skipped (weights and optimizer state bitwise unchanged)",
            identical(D_rows[at]["params"], before_D["params"]) and identical(D_rows[at]["state"], before_D["state"]))
    others = [i for i in range(len(D_rows)) if i != at]
    s.check(f"{label}: every other D update happened",
            all(moved(record.initial["D"] if i == 0 else D_rows[i - 1]["params"], D_rows[i]["params"]) for i in others))
    s.check(f"{label}: every G update happened, the one of step {at} included",
            all(moved(record.initial["G"] if i == 0 else G_rows[i - 1]["params"], G_rows[i]["params"])
                for i in range(len(G_rows))))
    # GradScaler's rule: x backoff_factor (0.5) after an update with inf/NaN gradients, x growth_factor after
    # growth_interval (2000) finite ones in a row, else unchanged. Updates in order: D0, G0, D1, G1, ...
    scales = [r["scale"] for r in record.rows]
    expected, scale = [], 256.0
    for r in record.rows:
        if r["net"] == "D" and r["step"] == at:
            scale *= 0.5
        expected.append(scale)
    s.check(f"{label}: the shared scale halves once, at D's update of step {at}, and G's update uses the halved scale",
            scales == expected, f"scales after each update: {scales}")


def _fp16_twin(run: Run, s: Section, width: int) -> None:
    steps, b, clip = 5, 8, 1.0
    images = digit_images(steps * b)
    with proof_mode(run):
        trainer = make_trainer(run, "fp16_twin", *small_dcgan(width), loader(images, b),
                               latents=TableLatents(8, dtype=torch.float32), max_steps=steps, mixed_precision="fp16",
                               lr_G=1e-3, lr_D=1e-3, lr_schedule="constant", clip_grad_norm_D=clip, z_dim=8,
                               accelerator=fp16_accelerator(run, init_scale=256.0))
        trainer.fit()
        twin = plain_dcgan_twin(run, images, b, steps, TableLatents(8, dtype=torch.float32), width, "fp16",
                                clip_D=clip, init_scale=256.0)
    diff = max(max_diff(cpu_state(trainer.G), twin["G"]), max_diff(cpu_state(trainer.D), twin["D"]))
    s.number("twin max |diff|", diff)
    s.check("fp16 run with D clipped = a plain loop with its own GradScaler (unscale D only, clip, step, update)",
            diff <= 1e-6, f"max |diff| {diff:.2e} (tolerance 1e-6; the same fp16 operations in the same order)")
    rows = metric_rows(trainer)
    logged = rows[-1]["grad_norm/D"]
    s.check("grad_norm/D is the unscaled norm", math.isclose(logged, twin["norms_D"][-1], rel_tol=1e-4),
            f"logged {logged:.6g}, the twin's after unscale_ {twin['norms_D'][-1]:.6g}")
    s.check("the twin's scale matches the engine's", rows[-1]["loss_scale"] == twin["scale"],
            f"{rows[-1]['loss_scale']} / {twin['scale']}")


def plain_dcgan_twin(run: Run, images: torch.Tensor, b: int, steps: int, latents: TableLatents, width: int,
                     precision: str, clip_D: float | None = None, init_scale: float = 256.0) -> dict:
    """The hand-written DCGAN loop under autocast (and, for fp16, its own GradScaler), fused Adam, lr 1e-3."""
    from gan_accel.objectives.losses import LOSSES

    device = run.device
    loss = LOSSES["nonsaturating"]
    G, D = small_dcgan(width)
    G.to(device), D.to(device)
    opt_G = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=True)
    opt_D = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=True)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if precision == "fp16" else None
    autocast = functools.partial(torch.autocast, device.type, dtype=dtype)
    scale = (lambda x: scaler.scale(x)) if scaler else (lambda x: x)
    norms = []
    for step in range(steps):
        real = images[step * b:(step + 1) * b].to(device)
        with autocast():
            fake = G(latents(b, device))
            loss_D = loss.d_loss(D(real), D(fake.detach()))
        scale(loss_D).backward()
        if clip_D:
            if scaler:
                scaler.unscale_(opt_D)
            norms.append(float(torch.nn.utils.clip_grad_norm_(D.parameters(), clip_D)))
        if scaler:
            scaler.step(opt_D)
            scaler.update()
        else:
            opt_D.step()
        opt_D.zero_grad(set_to_none=True)
        for p in D.parameters():
            p.requires_grad_(False)
        with autocast():
            loss_G = loss.g_loss(D(fake))
        scale(loss_G).backward()
        for p in D.parameters():
            p.requires_grad_(True)
        if scaler:
            scaler.step(opt_G)
            scaler.update()
        else:
            opt_G.step()
        opt_G.zero_grad(set_to_none=True)
    return {"G": cpu_state(G), "D": cpu_state(D), "norms_D": norms,
            "scale": float(scaler.get_scale()) if scaler else None}


# -- bf16 -----------------------------------------------------------------------------------------
def sec_bf16(run: Run, s: Section, report: Report) -> None:
    if run.cuda and not torch.cuda.is_bf16_supported():
        raise Skip("this GPU does not support bf16")
    width, steps, b = run.size(16, 4), 4, 8
    images = digit_images(steps * b)
    conv_dtypes: list[torch.dtype] = []
    with proof_mode(run):
        trainer = make_trainer(run, "bf16", *small_dcgan(width), loader(images, b),
                               latents=TableLatents(8, dtype=torch.float32), max_steps=steps, mixed_precision="bf16",
                               lr_G=1e-3, lr_D=1e-3, lr_schedule="constant", z_dim=8)
        # after the preflight, which calls D in fp32 outside autocast
        first_conv(trainer).register_forward_hook(lambda m, i, o: conv_dtypes.append(o.dtype))
        trainer.fit()
        twin = plain_dcgan_twin(run, images, b, steps, TableLatents(8, dtype=torch.float32), width, "bf16")
    s.check("D's convolutions ran in bf16", bool(conv_dtypes) and all(d == torch.bfloat16 for d in conv_dtypes),
            f"{len(conv_dtypes)} calls, dtypes {sorted({str(d) for d in conv_dtypes})}")
    s.check("weights stay float32", all(p.dtype == torch.float32 for p in trainer.G.parameters()))
    rows = metric_rows(trainer)
    s.check("losses finite", all(math.isfinite(r[k]) for r in rows for k in ("loss/D", "loss/G")))
    diff = max(max_diff(cpu_state(trainer.G), twin["G"]), max_diff(cpu_state(trainer.D), twin["D"]))
    s.number("twin max |diff|", diff)
    s.check("= a plain loop under torch.autocast(bf16)", diff <= 1e-6, f"max |diff| {diff:.2e} (tolerance 1e-6)")
    s.number("summary", f"bf16 autocast = plain bf16 loop, max |diff| {diff:.1e}")


# -- R1 and WGAN-GP under fp16 -------------------------------------------------------------------------
def _penalty_run(run: Run, name: str, make_loss: Callable, lr: float, magnitude: float,
                 init_scale: float | None) -> tuple[Any, torch.Tensor, float]:
    """One SGD step of D = LinearD on the penalty alone, under fp16: (trainer, w0 in float64, initial scale)."""
    from gan_accel import Phase

    w0 = (torch.rand(16, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 0.5) * magnitude
    D = LinearD(w0.float())
    w0 = D.linear.weight.detach().double().flatten().clone()  # exactly what the network starts from
    torch.manual_seed(0)
    G = TinyG()
    phase = Phase(name, "D", make_loss(), new_data=True, double_backward=True)
    with proof_mode(run):
        trainer = make_trainer(run, f"penalty_{name}", G, D, loader(tiny_images(32, torch.float32), 8), max_steps=1,
                               mixed_precision="fp16", phases=[phase], opt_D=torch.optim.SGD(D.parameters(), lr=lr),
                               accelerator=fp16_accelerator(run, init_scale=init_scale))
        scale = float(trainer.accelerator.scaler.get_scale())  # the initial scale
        trainer.fit()
    return trainer, w0, scale


def sec_penalties(run: Run, s: Section, report: Report) -> None:
    from gan_accel import gradient_penalty, r1_penalty

    s.note("D(x) = w.x + b, so grad_x D = w for every x: R1 = gamma/2 |w|^2 and its gradient gamma w; WGAN-GP = "
           "weight (|w| - 1)^2 with |w| = sqrt(sum w^2 + 1e-12) and gradient 2 weight (|w| - 1) w / |w|. One SGD step "
           "(lr known) from w0: the engine's w1 against w0 - lr x gradient, computed in float64. Under fp16 "
           "D runs in half precision, so w is rounded to fp16 (relative 2^-11): tolerance 4e-3, while a missing or "
           "doubled scale is off by the scale (2^10 here, so that nothing overflows: see the finding below).")
    cases = [("R1", lambda: r1_penalty(0.5), 0.5, 1.0, 0.05), ("GP", lambda: gradient_penalty(1.0), 1.0, 0.1, 0.1)]
    for name, make_loss, weight, lr, magnitude in cases:
        trainer, w0, scale = _penalty_run(run, name, make_loss, lr, magnitude, init_scale=2.0**10)
        w1 = trainer.accelerator.unwrap_model(trainer.D).linear.weight.detach().double().flatten().cpu()
        if name == "R1":
            value, grad = weight / 2 * w0.square().sum(), weight * w0
        else:
            norm = (w0.square().sum() + 1e-12).sqrt()
            value, grad = weight * (norm - 1) ** 2, 2 * weight * (norm - 1) * w0 / norm
        expected_step, engine_step = -lr * grad, w1 - w0
        error = ((engine_step - expected_step).abs() / expected_step.abs()).max().item()
        logged = metric_rows(trainer)[-1][f"loss/{name}"]
        s.number(f"{name}: closed form", value.item())
        s.number(f"{name}: logged loss", logged)
        s.number(f"{name}: max relative error of the update", error)
        s.check(f"{name} under fp16 (scale {scale:g}): the logged penalty is the closed form",
                math.isclose(logged, value.item(), rel_tol=4e-3), f"{logged:.6g} against {value.item():.6g}")
        s.check(f"{name} under fp16: D's update is -lr x the closed-form gradient (scaled, then unscaled once)",
                error <= 4e-3, f"max relative error {error:.2e} (tolerance 4e-3; a missing or double scale is off by "
                f"x{scale:g})")
        bias_moved = trainer.accelerator.unwrap_model(trainer.D).linear.bias.item() != 0.25
        s.check(f"{name}: D's bias gets the zero gradient the penalty gives it", not bias_moved)
    # At Accelerate's default initial scale, 2^16: autograd.grad of scaler.scale(logits.sum()) sends the scale
    # itself back into D's fp16 output as the gradient of every logit, and 65536 > fp16's largest value (65504).
    trainer, w0, scale = _penalty_run(run, "R1", lambda: r1_penalty(0.5), 1.0, 0.05, init_scale=None)
    row = metric_rows(trainer)[-1]
    skipped = trainer.guard.skipped.get("D", 0) if trainer.guard is not None else None
    s.number("R1 at Accelerate's default scale: scale, logged loss/R1, skipped/D, scale after",
             [scale, row.get("loss/R1"), skipped, row.get("loss_scale")])
    if not math.isfinite(row.get("loss/R1", math.nan)):
        s.finding("R1 and WGAN-GP overflow under fp16 whenever the loss scale is 2^16",
                  f"at Accelerate's default initial scale ({scale:g}) the R1 loss came out {row.get('loss/R1')} and the "
                  f"update was skipped (skipped/D = {skipped}, scale then {row.get('loss_scale')}). "
                  "objectives/regularizers.py scaled_input_gradients takes autograd.grad of scaler.scale(logits.sum()): "
                  "on CUDA autocast sums in fp32 and the gradient cast back into each fp16 logit is the scale itself, "
                  "and 2^16 > 65504 (fp16's largest) is inf, whatever the batch (where the sum stays fp16, as CPU "
                  "autocast keeps it, the scaled sum overflows already). So the first R1 (or every GP) update of an fp16 run is skipped, and again each "
                  "time the scaler grows back to 2^16 (every 2000 finite updates). A fix: take the input gradient of "
                  "scaler.scale(logits.sum()) / n (n the batch) and multiply it back by n, or cap the penalty's scale "
                  "at 2^15; the unscale stays exact.")
    s.number("summary", "R1 and GP under fp16 = closed forms" + ("" if not s.failed_checks else ": FAILED")
             + ("; overflow at scale 2^16 (finding)" if s.findings else ""))


# -- the divergence guard on the device ----------------------------------------------------------------
def _guard_trainer(run: Run, name: str, phases: list, precision: str = "no", **settings: Any) -> tuple[Any, RecordUpdates]:
    record = RecordUpdates()
    options = dict(max_steps=6, lr_G=1e-2, lr_D=1e-2)
    options.update(settings)
    if precision == "fp16":
        options.update(mixed_precision="fp16", accelerator=fp16_accelerator(run, init_scale=256.0))
    trainer = make_trainer(run, name, *tiny_models(torch.float32), loader(tiny_images(64, torch.float32), 4),
                           latents=TableLatents(Z_TINY, dtype=torch.float32), callbacks=(record,), phases=phases,
                           **options)
    record.initial = {"D": parameters_of(trainer.D), "G": parameters_of(trainer.G)}
    return trainer, record


def _skips_of(record: RecordUpdates, net: str = "D") -> list[int]:
    """Indices of ``net``'s updates that left weights and optimizer state bitwise unchanged."""
    rows = record.of(net)
    previous = [{"params": record.initial[net], "state": None}] + rows[:-1]
    return [i for i, (before, after) in enumerate(zip(previous, rows))
            if identical(before["params"], after["params"]) and (before["state"] is None or identical(before["state"], after["state"]))]


def sec_guard(run: Run, s: Section, report: Report) -> None:
    from gan_accel import DivergenceError, Phase, discriminator_loss, generator_loss
    from gan_accel.objectives.losses import LOSSES

    loss = LOSSES["nonsaturating"]
    d_loss = discriminator_loss(loss)

    def poisoned(ctx: Any) -> torch.Tensor:  # NaN loss at step 2, NaN gradients at step 4
        value = d_loss(ctx)
        if ctx.step == 2:
            return value + float("nan")
        if ctx.step == 4:
            return NaNGradient.apply(value)
        return value

    phases = [Phase("D", "D", poisoned, new_data=True), Phase("G", "G", generator_loss(loss))]
    label = "device"
    with proof_mode(run):
        trainer, record = _guard_trainer(run, "guard", phases)
        trainer.fit()
    expected_modes = {"fused": 12}
    s.check(f"{label}: skip mode {expected_modes}", trainer.runner.skippable.modes_used == expected_modes,
            f"modes used: {trainer.runner.skippable.modes_used}")
    s.check(f"{label}: exactly D's updates at steps 2 (NaN loss) and 4 (NaN gradients) skipped, bitwise "
            "(weights and Adam state)", _skips_of(record) == [2, 4] and _skips_of(record, "G") == [],
            f"skipped D updates {_skips_of(record)}, G {_skips_of(record, 'G')}")
    rows = metric_rows(trainer)
    s.check(f"{label}: skipped/D counted on the device and logged", [r["skipped/D"] for r in rows] == [0, 0, 1, 1, 2, 2],
            f"{[r['skipped/D'] for r in rows]}")
    s.check(f"{label}: weights finite", all(torch.isfinite(p).all() for p in trainer.D.parameters()))
    # DivergenceError at the first log row after max_bad_updates consecutive skips
    with proof_mode(run):
        trainer, _ = _guard_trainer(run, "diverge", d_loss_modified("from:1", "nan_loss"), max_steps=12, log_every=5,
                                    max_bad_updates=3)
        raised = ""
        try:
            trainer.fit()
        except DivergenceError as error:
            raised = str(error)
    s.check("3 consecutive NaN updates (max_bad_updates=3): DivergenceError at the next log row (step 5)",
            "noticed at step 5" in raised and trainer.step == 5, raised.split(";")[0] or "not raised")
    # fp16: a NaN loss becomes the scaler's skip
    with proof_mode(run):
        trainer, record = _guard_trainer(run, "guard_fp16", d_loss_modified(2, "nan_loss"), precision="fp16")
        trainer.fit()
    rows = metric_rows(trainer)
    s.check("fp16: a NaN loss is handed to the GradScaler: D's update of step 2 skipped, and only it",
            _skips_of(record) == [2] and _skips_of(record, "G") == [], f"skipped D updates {_skips_of(record)}")
    s.check("fp16: skipped/D = 1, the scale halved once", rows[-1]["skipped/D"] == 1 and rows[-1]["loss_scale"] == 128.0,
            f"skipped/D {rows[-1]['skipped/D']}, loss_scale {rows[-1]['loss_scale']}")
    s.check("fp16: skip mode 'scaler'", trainer.runner.skippable.modes_used == {"scaler": 12},
            f"{trainer.runner.skippable.modes_used}")
    s.number("summary", "NaN loss / NaN gradients skipped bitwise" + (", on the device" if run.cuda else "")
             + "; DivergenceError at the next row; fp16 via the scaler")


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
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
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


# -- engine against the hand-written loop ------------------------------------------------------------------
def _speed_case(run: Run) -> dict:
    """DCGAN 64 px width 64 batch 256 bf16 on CUDA; tiny and fp32 on CPU (bf16 is 6-16x slower on CPUs
    without bf16 units)."""
    return run.size(
        dict(image=64, width=64, channels=3, batch=256, precision="bf16", block=25, blocks=4, warmup=20, n=4096),
        dict(image=32, width=16, channels=3, batch=32, precision="no", block=5, blocks=3, warmup=3, n=512),
        cuda_quick=dict(image=64, width=64, channels=3, batch=256, precision="bf16", block=10, blocks=3, warmup=10, n=2048),
        cpu_quick=dict(image=32, width=8, channels=3, batch=16, precision="no", block=3, blocks=2, warmup=2, n=256))


def _speed_build(case: dict) -> Callable[[], tuple[nn.Module, nn.Module, int]]:
    from gan_accel.models import DCGANDiscriminator, DCGANGenerator

    def build() -> tuple[nn.Module, nn.Module, int]:
        torch.manual_seed(0)
        return (DCGANGenerator(z_dim=100, width=case["width"], image_size=case["image"], channels=case["channels"]),
                DCGANDiscriminator(width=case["width"], image_size=case["image"], channels=case["channels"]), 100)

    return build


def _speed_data(case: dict) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (case["n"], case["channels"], case["image"], case["image"]), generator=g, dtype=torch.uint8)


class DevicePlainLoop:
    """pytorch/examples' DCGAN step on the device: the same models, data path (the batch copied to the device
    as Accelerate copies it), fused Adam, and autocast as the engine's."""

    def __init__(self, run: Run, build: Callable, data: torch.Tensor, batch: int, precision: str) -> None:
        self.device = run.device
        self.G, self.D, self.z_dim = build()
        self.G.to(self.device), self.D.to(self.device)
        self.opt_G = torch.optim.Adam(self.G.parameters(), lr=2e-4, betas=(0.5, 0.999), fused=True)
        self.opt_D = torch.optim.Adam(self.D.parameters(), lr=2e-4, betas=(0.5, 0.999), fused=True)
        self.batch = batch
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.autocast = (functools.partial(torch.autocast, self.device.type, dtype=dtype) if dtype
                         else contextlib.nullcontext)
        data_loader = engine_overhead.loader_for(data, batch)
        self.stream = (b for _ in iter(int, 1) for b in data_loader)

    def step(self) -> None:
        G, D = self.G, self.D
        real = next(self.stream)[0].to(self.device)
        with self.autocast():
            fake = G(torch.randn(self.batch, self.z_dim, device=self.device))
            loss_D = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
        self.opt_D.zero_grad(set_to_none=True)
        loss_D.backward()
        self.opt_D.step()
        for p in D.parameters():
            p.requires_grad_(False)
        with self.autocast():
            loss_G = F.softplus(-D(fake)).mean()
        self.opt_G.zero_grad(set_to_none=True)
        loss_G.backward()
        self.opt_G.step()
        for p in D.parameters():
            p.requires_grad_(True)


class Blocks:
    """After warm-up, blocks of ``block`` engine steps alternate with blocks of ``block`` plain steps, each
    block timed between synchronisations: both see the same machine, and the GPU's queue is drained at
    every block edge, so a block's time is its throughput (CPU launch overhead hidden behind the GPU
    where it can be, as in real training)."""

    name = "gpu_check_blocks"

    def __init__(self, run: Run, plain: DevicePlainLoop, warmup: int, block: int) -> None:
        self.run, self.plain, self.warmup, self.block = run, plain, warmup, block
        self.engine_s: list[float] = []
        self.plain_s: list[float] = []
        self.mark: float | None = None

    def on_step_end(self, trainer: Any) -> None:
        if trainer.step < self.warmup:
            self.plain.step()  # the plain loop warms up alongside
            return
        if (trainer.step - self.warmup) % self.block:
            return
        self.run.sync()
        now = time.perf_counter()
        if self.mark is not None:
            self.engine_s.append(now - self.mark)
            start = time.perf_counter()
            for _ in range(self.block):
                self.plain.step()
            self.run.sync()
            self.plain_s.append(time.perf_counter() - start)
        self.mark = time.perf_counter()


def sec_engine_vs_plain(run: Run, s: Section, report: Report) -> None:
    case = _speed_case(run)
    build, data = _speed_build(case), _speed_data(case)
    repeats = run.size(run.repeats, run.repeats, cpu_quick=2, cuda_quick=2)
    ratios, engine_ips, plain_ips = [], [], []
    for repeat in range(repeats):
        reset_accelerate()
        blocks = Blocks(run, DevicePlainLoop(run, build, data, case["batch"], case["precision"]), case["warmup"],
                        case["block"])
        steps = case["warmup"] + case["blocks"] * case["block"]
        trainer = engine_overhead.quiet_trainer(build, data, case["batch"], steps, str(run.folder(f"speed_{repeat}")), [blocks],
                                mixed_precision=case["precision"])
        if repeat == 0:
            s.check(f"the engine trains on {run.device.type}", trainer.accelerator.device.type == run.device.type)
        trainer.fit()
        images = case["block"] * case["batch"] * len(blocks.engine_s)
        engine_ips.append(images / sum(blocks.engine_s))
        plain_ips.append(images / sum(blocks.plain_s))
        ratios.append(engine_ips[-1] / plain_ips[-1])
        del trainer, blocks
        _free(run)
    ratio = statistics.median(ratios)
    label = (f"DCGAN {case['image']} px, width {case['width']}, {case['channels']} channels, batch {case['batch']}, "
             f"{case['precision'] if case['precision'] != 'no' else 'fp32'}")
    s.number("case", label)
    s.number("plain loop, images/s (median)", round(statistics.median(plain_ips)))
    s.number("engine, images/s (median)", round(statistics.median(engine_ips)))
    s.number("engine / plain (median)", round(ratio, 4))
    s.number("engine / plain per repeat", [round(r, 4) for r in ratios])
    s.number("spread (max - min)", round(max(ratios) - min(ratios), 4))
    s.target("engine / plain images/s", ratio, 0.97, label)
    s.note(f"{repeats} repeats, each one process: {case['warmup']} warm-up steps, then {case['blocks']} blocks of "
           f"{case['block']} engine steps alternating with {case['block']} plain steps, synchronised at every block "
           "edge. The engine runs with its defaults (divergence guard, metrics, a log row every 50 steps) but "
           "writes no files; both sides: the same models, fused Adam, the same uint8 in-memory data copied to the "
           "device per batch.")
    if not run.cuda:
        s.note("CPU: tiny and fp32, to keep the code working; the number means nothing.")
    s.number("summary", f"engine/plain {ratio:.3f} ({label})")


def _free(run: Run) -> None:
    gc.collect()
    if run.cuda:
        torch.cuda.empty_cache()


# -- host-device synchronisations per step ------------------------------------------------------------------
class SyncCounter:
    """Counts CUDA sync warnings (``torch.cuda.set_sync_debug_mode("warn")``) per step: the interval from one
    step's end to the next, labelled by whether a log row, sample or checkpoint happened in it."""

    name = "gpu_check_syncs"

    def __init__(self, records: list, skip: int) -> None:
        self.records, self.skip = records, skip
        self.mark = 0
        self.clean: list[int] = []
        self.busy: list[int] = []
        self.sites_clean: dict[str, int] = {}

    def on_step_end(self, trainer: Any) -> None:
        new = [w for w in self.records[self.mark:] if _is_sync(w)]
        self.mark = len(self.records)
        cfg = trainer.config
        previous = trainer.step - 1  # its log row / sample / checkpoint ran after its on_step_end, in this interval
        busy = previous > 0 and (previous % cfg.log_every == 0 or previous % cfg.sample_every == 0
                                 or previous % cfg.checkpoint_every == 0)
        if trainer.step <= self.skip:
            return
        (self.busy if busy else self.clean).append(len(new))
        if not busy:
            for w in new:
                site = f"{Path(w.filename).name}:{w.lineno}"
                self.sites_clean[site] = self.sites_clean.get(site, 0) + 1


def sec_syncs(run: Run, s: Section, report: Report) -> None:
    from gan_accel import GANTrainer, TrainConfig

    if not run.cuda:
        raise Skip("n/a on CPU: CPU kernels run synchronously, there is nothing to wait for (host reads in a "
                   "step are counted on CPU by tests/test_guard.py::test_a_step_reads_nothing_back_from_the_device)")
    case = dict(_speed_case(run), n=1024)
    build, data = _speed_build(case), _speed_data(case)
    configs = {
        "benchmark (quiet: no files, log every 10)": dict(quiet=True, settings=dict(log_every=10)),
        "defaults + EMA, progress bar, samples every 10": dict(quiet=False, settings=dict(
            log_every=10, ema_decay=0.99, progress_bar=True, sample_every=10)),
    }
    steps, skip = 32, 3
    first = None
    for label, spec in configs.items():
        reset_accelerate()
        G, D, z_dim = build()
        settings = dict(max_steps=steps, batch_size=case["batch"], z_dim=z_dim, lr_schedule="constant", warmup_ratio=0.0,
                        output_dir=str(run.folder("syncs")), mixed_precision=case["precision"], progress_bar=False,
                        checkpoint_every=10**6)
        settings.update(spec["settings"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            counter = SyncCounter(caught, skip)
            trainer = GANTrainer(G, D, engine_overhead.loader_for(data, case["batch"]), TrainConfig(**settings), callbacks=[counter],
                                 disable_callbacks=QUIET if spec["quiet"] else ())
            caught.clear()
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.fit()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        per_step = statistics.mean(counter.clean) if counter.clean else math.nan
        first = first if first is not None else per_step
        s.number(f"{label}: syncs per step outside log rows (mean, max)", [round(per_step, 2), max(counter.clean, default=0)])
        s.number(f"{label}: syncs per step with a log row / sample (mean)",
                 round(statistics.mean(counter.busy), 1) if counter.busy else None)
        s.number(f"{label}: where (file:line: count over {len(counter.clean)} steps)", counter.sites_clean)
        s.check(f"{label}: no more syncs per step outside log rows than the plain loop's batch copy (1)",
                max(counter.clean, default=0) <= 1, f"mean {per_step:.2f} per step; sites {counter.sites_clean}")
        del trainer
        _free(run)
    plain = DevicePlainLoop(run, build, data, case["batch"], case["precision"])
    for _ in range(skip):
        plain.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(10):
                plain.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    plain_syncs = [w for w in caught if _is_sync(w)]
    s.number("plain loop: syncs per step", len(plain_syncs) / 10)
    s.number("plain loop: where", _sites(plain_syncs))
    s.note("A blocking host-to-device copy of a pageable batch (the plain loop's .to(device), Accelerate's "
           "send_to_device with non_blocking=False) counts as one sync per step on both sides; pinned memory and "
           "DataLoaderConfiguration(non_blocking=True) would remove it.")
    s.number("summary", f"engine {first:.2f} syncs per step outside log rows, plain loop {len(plain_syncs) / 10:.1f}")


def _is_sync(record: Any) -> bool:
    return "synchroniz" in str(record.message)


def _sites(records: list) -> dict[str, int]:
    sites: dict[str, int] = {}
    for w in records:
        site = f"{Path(w.filename).name}:{w.lineno}"
        sites[site] = sites.get(site, 0) + 1
    return sites


# -- peak GPU memory -----------------------------------------------------------------------------------------
def sec_memory(run: Run, s: Section, report: Report) -> None:
    if not run.cuda:
        raise Skip("n/a on CPU (peak GPU memory); the peak RSS of the engine and the plain loop, each in a fresh "
                   "process, is benchmarks/run.py --sections memory")
    case = _speed_case(run)
    build, data = _speed_build(case), _speed_data(case)
    steps = 10
    _free(run)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    reset_accelerate()
    trainer = engine_overhead.quiet_trainer(build, data, case["batch"], steps, str(run.folder("memory")), [],
                            mixed_precision=case["precision"])
    trainer.fit()
    run.sync()
    engine_peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del trainer
    reset_accelerate()
    _free(run)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    plain = DevicePlainLoop(run, build, data, case["batch"], case["precision"])
    for _ in range(steps):
        plain.step()
    run.sync()
    plain_peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del plain
    _free(run)
    s.number("engine peak, MiB", round(engine_peak, 1))
    s.number("plain loop peak, MiB", round(plain_peak, 1))
    s.number("engine / plain", round(engine_peak / plain_peak, 3))
    s.note(f"{steps} steps each, one after the other in this process; peak of torch.cuda.max_memory_allocated above "
           "what was allocated before (the same case as engine_vs_plain).")
    s.check("both measured", engine_peak > 0 and plain_peak > 0)
    s.number("summary", f"engine {engine_peak:,.0f} MiB, plain {plain_peak:,.0f} MiB")


# -- the recipe ---------------------------------------------------------------------------------------------
def sec_recipe(run: Run, s: Section, report: Report) -> None:
    """``gan-accel train`` at its defaults on coloured digits at 64 px: the recipe table's row for a GPU."""
    num, max_time = run.size(2000, 500, cuda_quick=500, cpu_quick=40), run.size(120, 60, cuda_quick=30, cpu_quick=60)
    made = make_rgb_digits(run.folder("recipe_data"), num, 64, 0, mnist_dir=run.data_dir)
    s.number("data", f"{num:,} coloured digits at 64 px ({made['source']})")
    out = run.folder("recipe_run")
    argv = ["--data", made["out"], "--resolution", "64", "--output-dir", str(out), "--max-time", str(max_time)]
    if not run.cuda and run.quick:  # a few seconds: the CPU row (dcgan at 64 px), tiny
        argv += ["--steps", "4", "--width", "4", "--batch-size", "8", "--log-every", "2", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if CUBLAS_SET_HERE:  # the proofs' setting, not the user's: the run is the default command as shipped
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gan_accel.cli", "train", *argv], env=env, capture_output=True,
                          text=True, timeout=max_time + 40)  # under the section's budget: the log still comes back
    wall = time.perf_counter() - start
    (report.out / "recipe_64px.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    s.note("The run's log: recipe_64px.log next to this report; `gan-accel train " + " ".join(argv[:8]) + " ...`")
    failure = f"exit {done.returncode}: " + _last_line(done.stderr or done.stdout)
    if not s.check("the default command ran", done.returncode == 0, failure if done.returncode else f"{wall:.0f} s"):
        return
    _recipe_numbers(s, out, done.stdout + done.stderr, report)


def _recipe_numbers(s: Section, out: Path, log: str, report: Report) -> None:
    """What the recipe's run printed and logged: its choice, speed, losses, skipped updates and last grid."""
    import shutil

    from gan_accel.callbacks.metrics_log import read_metrics

    for key, pattern in (("recipe", r"the recipe for .*"), ("model", r"\S+ G and D \(.*")):
        found = re.search(pattern, log)
        s.number(key, found.group(0) if found else "not printed")
    rows = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    if not s.check("metrics logged", bool(rows), str(out / "metrics.jsonl")):
        return
    steps = int(rows[-1]["step"])  # the skip counters' step; the run may have gone on to its time limit
    stopped = re.search(r"stopped at the time limit .*? at step ([\d,]+) of", log)
    speeds = [r["images/s"] for r in rows[1:] or rows if "images/s" in r]
    s.number("steps", int(stopped.group(1).replace(",", "")) if stopped else steps)
    s.number("images/s (median)", round(statistics.median(speeds), 1) if speeds else "not logged")
    memory = [v for r in rows for k, v in r.items() if "memory" in k]
    if memory:
        s.number("peak GPU memory (logged)", max(memory))
    losses = [(r["step"], k, v) for r in rows for k, v in r.items() if k.startswith("loss/")]
    bad = [f"{k}={v} at step {step}" for step, k, v in losses if not (isinstance(v, (int, float)) and math.isfinite(v))]
    s.check("every logged loss is finite", bool(losses) and not bad, "; ".join(bad[:3]) or f"{len(losses)} values")
    skipped = {k: int(v) for k, v in rows[-1].items() if k.startswith("skipped")}
    s.number("skipped updates", skipped)
    s.check("skipped updates <= 10% of steps", all(v <= 0.1 * steps for v in skipped.values()), str(skipped))
    grids = sorted(out.glob("samples_*.png"), key=lambda p: (p.stem == "samples_final", p.stem))
    if grids:
        shutil.copyfile(grids[-1], report.out / "recipe_64px.png")
    for name, end in (("metrics.jsonl", "_metrics.jsonl"), ("training_plot.png", "_plot.png")):
        if (out / name).is_file():  # the loss curves, as numbers and as the run's own plot
            shutil.copyfile(out / name, report.out / f"recipe_64px{end}")
    s.number("grid", f"recipe_64px.png (the run's {grids[-1].name})" if grids else "none written")
    s.number("summary", f"{s.numbers['model'].split(' G and D')[0]}: {s.numbers['steps']} steps, "
             f"{s.numbers['images/s (median)']} img/s, skipped {sum(skipped.values())}")


# -- the quickstart ----------------------------------------------------------------------------------------
def quickstart_driver(spec: dict) -> int:
    """In a fresh process: ``examples/dcgan_mnist.py``'s main with ``spec["argv"]``; ``spec["compile"]`` adds
    ``compile=True`` to its TrainConfig (the example has no --compile flag)."""
    import importlib.util

    path = ROOT / "examples" / "dcgan_mnist.py"
    module_spec = importlib.util.spec_from_file_location("dcgan_mnist_example", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if spec.get("compile"):
        module.TrainConfig = functools.partial(module.TrainConfig, compile=True)
    return module.main(spec["argv"])


def _mnist_available(data_dir: str) -> bool:
    return (Path(data_dir) / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file()


def sec_quickstart(run: Run, s: Section, report: Report) -> None:
    from gan_accel.eval.mnist import cache_dir

    mnist = _mnist_available(run.data_dir)
    s.number("data", f"MNIST in {run.data_dir}" if mnist else f"no MNIST in {run.data_dir}: the offline digits "
             "(--dataset digits; scores judged by a classifier trained on them)")
    classifier = cache_dir() / f"{'mnist' if mnist else 'offline-digits'}_classifier.safetensors"  # eval/mnist.py's
    evaluate = not run.quick or run.cuda or classifier.is_file()
    if evaluate and not classifier.is_file():  # trained once here, so that neither run's wall time includes it
        from gan_accel.data import resolve_dataset
        from gan_accel.eval.mnist import load_or_train_classifier, reference_digits

        start = time.perf_counter()
        fallback = None if mnist else resolve_dataset("digits", run.data_dir)  # the set the example falls back to
        _, (train_x, train_y), _ = reference_digits(run.data_dir, fallback=fallback)
        load_or_train_classifier(classifier, train_x, train_y)
        s.number(f"{classifier.name} trained once (in neither run's time), s", round(time.perf_counter() - start, 1))
    # The defaults' sizes in this mode, and the fast run's: the same images, batch x ratio, lr x sqrt(ratio)
    base_batch = 64 if run.cuda else 16
    base_steps, every_sample, every_log = run.size(5000, 40, cuda_quick=500, cpu_quick=4), *run.size(
        (500, 50), (10, 5), cuda_quick=(100, 10), cpu_quick=(2, 2))
    fast_batch = run.fast_batch if run.cuda else 2 * base_batch
    ratio = fast_batch / base_batch
    lr = run.fast_lr or 1e-3 * math.sqrt(ratio)
    fast_steps = max(1, round(base_steps / ratio))
    compile_fast = run.cuda or not run.quick
    bf16 = "bf16" if not run.cuda or torch.cuda.is_bf16_supported() else "no"
    common = ["--data-dir", run.data_dir, "--no-progress"] + (["--eval"] if evaluate else [])
    if not mnist:  # no download attempt (a GPU machine here has no network): the offline digits at once
        common += ["--dataset", "digits"]
    defaults = [] if run.cuda and not run.quick else ["--steps", str(base_steps), "--sample-every", str(every_sample),
                                                        "--log-every", str(every_log)]
    if not run.cuda:
        common += ["--width", "8", "--num-eval", "500"]
        defaults += ["--batch-size", str(base_batch)]
    runs = {
        "defaults": dict(argv=common + defaults, compile=False),
        "fast": dict(argv=common + ["--mixed-precision", bf16, "--channels-last", "--batch-size", str(fast_batch),
                                    "--lr-g", f"{lr:.4g}", "--lr-d", f"{lr:.4g}", "--steps", str(fast_steps),
                                    "--ema-decay", f"{0.99 ** ratio:.4f}",
                                    "--sample-every", str(max(1, round(every_sample / ratio))),
                                    "--log-every", str(max(1, round(every_log / ratio))),
                                    "--checkpoint-every", str(max(1, round(1000 / ratio)))],
                     compile=compile_fast),
    }
    s.note(f"defaults: {'the example as shipped' if run.cuda and not run.quick else f'{base_steps} steps of {base_batch}'}"
           f"; fast: {bf16 if bf16 != 'no' else 'fp32 (no bf16 on this GPU)'}, channels_last, "
           f"{'compile' if compile_fast else 'no compile (CPU --quick)'}, batch {fast_batch} ({ratio:g}x) with lr "
           f"{lr:.3g} (1e-3 x sqrt({ratio:g}), Adam's square-root rule), {fast_steps} steps (the same images as the "
           f"default's {base_steps}), EMA decay 0.99^{ratio:g} per step (the same half-life in images), samples, log "
           "rows and checkpoints at the same images.")
    if not evaluate:
        s.note(f"scores not computed: --quick on CPU and {classifier.name} is not cached in {classifier.parent} (training "
               "it takes 30 s to minutes on a small CPU)")
    in_process = not run.cuda and run.quick
    if in_process:
        s.note("CPU --quick: each run in this process (quickstart_driver, what the subprocess runs), so the wall "
               "time leaves out an interpreter start; on CUDA and without --quick each run is a fresh process.")
    for name, spec in runs.items():
        out = run.folder(f"quickstart_{name}")
        spec = dict(spec, argv=spec["argv"] + ["--output-dir", str(out)])
        start = time.perf_counter()
        if in_process:
            code, stdout, stderr = _in_process(spec)
        else:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
            if CUBLAS_SET_HERE:  # the proofs' setting, not the user's: the quickstart runs as shipped
                env.pop("CUBLAS_WORKSPACE_CONFIG", None)
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--quickstart-driver",
                                   json.dumps(spec)], env=env, capture_output=True, text=True,
                                  timeout=max(10.0, run.deadline - time.monotonic() - 5))
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        wall = time.perf_counter() - start
        (report.out / f"quickstart_{name}.log").write_text(stdout + "\n--- stderr ---\n" + stderr)
        if not s.check(f"{name}: the example ran", code == 0,
                       f"exit {code}: " + _last_line(stderr or stdout) if code else f"{wall:.0f} s"):
            continue
        result = _quickstart_numbers(out, stdout, wall)
        s.number(name, result)
        if evaluate:
            s.check(f"{name}: scored", "fd" in result, f"FD {result.get('fd', 'missing')}")
    summary = ", ".join(f"{name}: {s.numbers[name]['wall_s']:.0f} s, {s.numbers[name].get('images_per_s', 0):,.0f} img/s"
                        + (f", FD {s.numbers[name]['fd']:.2f}" if "fd" in s.numbers[name] else "")
                        for name in runs if name in s.numbers)
    s.number("summary", summary or "no run finished")
    s.note("Logs of both runs: quickstart_defaults.log, quickstart_fast.log next to this report.")


def _in_process(spec: dict) -> tuple[int, str, str]:
    """``quickstart_driver(spec)`` in this process: (exit code, stdout, stderr)."""
    import io

    reset_accelerate()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = quickstart_driver(spec)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    reset_accelerate()
    return code, out.getvalue(), err.getvalue()


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _quickstart_numbers(out: Path, stdout: str, wall: float) -> dict:
    from gan_accel.callbacks.metrics_log import read_metrics

    result: dict[str, Any] = {"wall_s": round(wall, 1)}
    found = re.search(r"gan_accel: (\S+) \((\d+) images from (.+?)\); (\d+) steps of (\d+)", stdout)
    if found:
        result.update(dataset=found.group(1), steps=int(found.group(4)), batch=int(found.group(5)))
    rows = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    speeds = [r["images/s"] for r in rows[1:] or rows if "images/s" in r]
    if speeds:
        result["images_per_s"] = round(statistics.median(speeds), 1)
    if (out / "eval.json").exists():
        scores = json.loads((out / "eval.json").read_text())
        result.update({k: round(scores[k], 4) for k in ("fd", "kid", "precision", "recall", "mean_confidence",
                                                         "class_entropy", "min_class_share", "max_class_share")
                       if k in scores})
    return result


# ================================================================================================
# Driving the sections
# ================================================================================================
@dataclass
class Spec:
    title: str
    run: Callable[[Run, Section, Report], None]
    estimate: tuple[float, float]  # expected seconds (cuda, cpu): a section is not started without this much time
    budget: tuple[float, float]  # the most it may take (cuda, cpu)


SECTIONS: dict[str, Spec] = {
    "env": Spec("Environment", sec_env, (2, 1), (30, 30)),
    "recipe": Spec("The default command's recipe at 64 px, first minutes", sec_recipe, (150, 30), (170, 150)),
    "accumulation": Spec("Accumulation = larger batch, on the device", sec_accumulation, (10, 4), (60, 60)),
    "twin": Spec("Engine = plain-PyTorch twin, on the device", sec_twin, (5, 2), (60, 60)),
    "resume": Spec("Exact resume on the device", sec_resume, (25, 6), (120, 90)),
    "fp16": Spec("fp16: one GradScaler, two optimizers, a forced overflow", sec_fp16, (15, 6), (90, 90)),
    "bf16": Spec("bf16 autocast", sec_bf16, (5, 2), (60, 60)),
    "penalties": Spec("R1 and WGAN-GP under fp16 loss scaling", sec_penalties, (5, 2), (60, 60)),
    "guard": Spec("Divergence guard on the device", sec_guard, (10, 4), (60, 60)),
    "channels_last": Spec("channels_last", sec_channels_last, (5, 2), (60, 60)),
    "checkpoint": Spec("A checkpoint written on the device, sampled without a GPU", sec_checkpoint, (15, 10), (90, 90)),
    "evaluator": Spec("The Evaluator callback on the device", sec_evaluator, (5, 2), (60, 60)),
    "syncs": Spec("Host-device synchronisations per step", sec_syncs, (20, 0), (90, 30)),
    "engine_vs_plain": Spec("Engine against the hand-written loop", sec_engine_vs_plain, (45, 8), (150, 120)),
    "memory": Spec("Peak GPU memory, engine against the plain loop", sec_memory, (15, 0), (60, 30)),
    "quickstart": Spec("The quickstart: examples/dcgan_mnist.py, defaults and fast options", sec_quickstart,
                       (150, 20), (400, 300)),
    "compile": Spec("torch.compile, with the R1 phase eager", sec_compile, (60, 15), (200, 240)),
}
RESERVE_S = 5.0  # kept for writing the report


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise SectionTimeout in this (main) thread after ``seconds`` (SIGALRM; no limit where there is none)."""
    if not hasattr(signal, "setitimer") or seconds <= 0:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise SectionTimeout(f"passed its time budget of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cleanup(run: Run) -> None:
    """Process-wide state a section may leave behind."""
    reset_accelerate()
    torch.use_deterministic_algorithms(False)
    if run.cuda:
        torch.cuda.set_sync_debug_mode("default")
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    _free(run)


def run_sections(run: Run, names: list[str], report: Report) -> None:
    for name in names:
        spec = SECTIONS[name]
        section = Section(name, spec.title)
        report.sections.append(section)
        index = 0 if run.cuda else 1
        left = run.deadline - time.monotonic()
        estimate = spec.estimate[index] * (0.5 if run.quick else 1.0)
        if left < estimate + RESERVE_S:
            section.status, section.reason = "not run", f"out of time (needs ~{estimate:.0f} s, {max(left, 0):.0f} s left)"
            report.write()
            continue
        print(f"gpu_check: {name} ...", flush=True)
        start = time.monotonic()
        try:
            with time_limit(min(spec.budget[index], left - RESERVE_S)):
                spec.run(run, section, report)
            section.status = "fail" if section.failed_checks or section.error else "pass"
        except Skip as skip:
            section.status, section.reason = "skipped", str(skip)
        except BaseException as error:  # noqa: BLE001 - a failing section never stops the others
            if isinstance(error, KeyboardInterrupt):
                section.status, section.error = "fail", "interrupted"
                report.write()
                raise
            section.status = "fail"
            section.error = f"{type(error).__name__}: " + (str(error).strip().splitlines() or [""])[0]
            section.traceback = traceback.format_exc()[-4000:]
        finally:
            section.seconds = round(time.monotonic() - start, 1)
            for text in NONDETERMINISTIC:
                section.notes.append(f"nondeterministic op under deterministic algorithms: {text.splitlines()[0]}")
            NONDETERMINISTIC.clear()
            try:
                cleanup(run)
            except Exception as error:  # noqa: BLE001
                section.notes.append(f"cleanup after the section failed: {error}")
        print(f"gpu_check: {name}: {section.status} ({section.seconds:.1f} s)"
              + (f": {section.error or section.reason}" if section.error or section.reason else ""), flush=True)
        report.write()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, run in this order: {','.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU: seconds; CUDA: a smoke run)")
    parser.add_argument("--out", default="gpu_check_report", help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds for the whole run (default: 570 on CUDA, 300 with --quick; CPU: 900, 300 quick)")
    parser.add_argument("--data-dir", default=os.environ.get("GAN_ACCEL_MNIST_DIR") or os.environ.get("GAN_ACCEL_DATA_DIR")
                        or "./data", help="a folder with MNIST/raw (env GAN_ACCEL_MNIST_DIR); else the offline digits")
    parser.add_argument("--fast-batch", type=int, default=256, help="the quickstart's fast run: batch size")
    parser.add_argument("--fast-lr", type=float, default=None, help="its lr (default 1e-3 x sqrt(batch / 64))")
    parser.add_argument("--repeats", type=int, default=3, help="engine_vs_plain repeats")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: torch's; 1 with --device cpu --quick, where the networks are tiny "
                             "and a second thread only adds waiting on a shared machine)")
    parser.add_argument("--keep-work", action="store_true", help="keep the runs' folders (printed at the end)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.sections.split(",") if n and n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}: choose from {','.join(SECTIONS)}")
    return args


CUBLAS_SET_HERE: list[bool] = []  # non-empty while this run has set CUBLAS_WORKSPACE_CONFIG itself


@contextlib.contextmanager
def _environment(device: str, threads: int):
    """Variables this run sets, restored afterwards (the tests run it in their own process)."""
    saved = {k: os.environ.get(k) for k in ("ACCELERATE_USE_CPU", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS")}
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the processes this run starts (sampling, the quickstart)
    if device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"  # stay on CPU on a GPU machine too
    else:
        os.environ.pop("ACCELERATE_USE_CPU", None)
        if "CUBLAS_WORKSPACE_CONFIG" not in os.environ:  # before cuBLAS starts: deterministic GEMMs for the proofs
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
            CUBLAS_SET_HERE.append(True)
    try:
        yield
    finally:
        CUBLAS_SET_HERE.clear()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--quickstart-driver"]:
        return quickstart_driver(json.loads(argv[1]))
    args = parse_args(argv)
    out = Path(args.out)
    names = [n for n in args.sections.split(",") if n]
    if "env" not in names:
        names.insert(0, "env")
    default_deadline = {("cuda", False): 570, ("cuda", True): 300, ("cpu", False): 900, ("cpu", True): 300}
    deadline = args.deadline or default_deadline[(args.device, args.quick)]
    options = dict(vars(args), sections=names, deadline=deadline)
    report = Report(out, options)
    if args.device == "cuda" and not torch.cuda.is_available():
        report.environment = {"torch": torch.__version__, "device_name": "no CUDA device"}
        report.sections = [Section(n, SECTIONS[n].title, status="not run", reason="no CUDA device") for n in names]
        report.finished = True
        report.write()
        print("gpu_check: --device cuda, but torch sees no CUDA device (use --device cpu for the CPU check)",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    run = Run(device=torch.device(args.device), quick=args.quick, out=out, work=work, data_dir=args.data_dir,
              deadline=time.monotonic() + deadline, fast_batch=args.fast_batch, fast_lr=args.fast_lr,
              repeats=args.repeats)
    report.write()
    threads = torch.get_num_threads()
    if args.threads or (args.device == "cpu" and args.quick):
        torch.set_num_threads(args.threads or 1)
    try:
        with _environment(args.device, torch.get_num_threads()):
            run_sections(run, names, report)
    finally:
        torch.set_num_threads(threads)
        report.finished = True
        report.write()
        if args.keep_work:
            print(f"gpu_check: the runs' folders are in {work}")
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    failed = [s.name for s in report.sections if s.status == "fail"]
    print(f"gpu_check: report in {out / REPORT_MD} ({time.time() - report.started:.0f} s); "
          + (f"FAILED: {', '.join(failed)}" if failed else "no section failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
