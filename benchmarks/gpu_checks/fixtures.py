"""What every section shares: the run (device, sizes, folders, clock), the bitwise-proof settings, tiny
models, data and a latent table both sides draw from, a trainer factory, and comparisons of weights and
optimizer states."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]  # the repository
QUIET = ("sample_saver", "training_plot", "checkpointer", "weights_exporter", "progress_bar", "signal_handler")  # no files, as the benchmarks run
CUBLAS_SET_HERE: list[bool] = []  # non-empty while this run has set CUBLAS_WORKSPACE_CONFIG itself


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


def child_env(as_shipped: bool = False) -> dict[str, str]:
    """The environment of a process this run starts: the repository importable; ``as_shipped`` leaves out the
    proofs' CUBLAS_WORKSPACE_CONFIG where this run set it (the user's own setting stays)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if as_shipped and CUBLAS_SET_HERE:
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    return env


def free_memory(run: Run) -> None:
    gc.collect()
    if run.cuda:
        torch.cuda.empty_cache()


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


def read_metrics_of(folder: Path) -> list[dict]:
    """A run folder's metrics.jsonl rows (none if it wrote none)."""
    from gan_accel.callbacks.metrics_log import read_metrics

    path = folder / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def metric_rows(trainer: Any) -> list[dict]:
    return read_metrics_of(Path(trainer.config.output_dir))


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
        self.initial: dict[str, dict] = {}

    def start(self, trainer: Any) -> None:
        """The weights before the first update (after the preflight)."""
        self.initial = {"D": parameters_of(trainer.D), "G": parameters_of(trainer.G)}

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

