"""Sections that measure rather than prove: the engine against a hand-written loop on the device (blocks
of steps alternating in one process), host-device synchronisations per step, and peak GPU memory."""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import engine_overhead  # benchmarks/: the benchmarks' quiet trainer and in-memory loader

from .fixtures import QUIET, Run, free_memory, reset_accelerate
from .report import Report, Section, Skip


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
        free_memory(run)
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
        self.sites_clean: Counter[str] = Counter()

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
            self.sites_clean.update(_sites(new))


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
        free_memory(run)
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
    """How many of the warnings each code line (file:line) raised."""
    return dict(Counter(f"{Path(w.filename).name}:{w.lineno}" for w in records))


# -- peak GPU memory -----------------------------------------------------------------------------------------
def sec_memory(run: Run, s: Section, report: Report) -> None:
    if not run.cuda:
        raise Skip("n/a on CPU (peak GPU memory); the peak RSS of the engine and the plain loop, each in a fresh "
                   "process, is benchmarks/run.py --sections memory")
    case = _speed_case(run)
    build, data = _speed_build(case), _speed_data(case)
    steps = 10
    free_memory(run)
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
    free_memory(run)
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    plain = DevicePlainLoop(run, build, data, case["batch"], case["precision"])
    for _ in range(steps):
        plain.step()
    run.sync()
    plain_peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del plain
    free_memory(run)
    s.number("engine peak, MiB", round(engine_peak, 1))
    s.number("plain loop peak, MiB", round(plain_peak, 1))
    s.number("engine / plain", round(engine_peak / plain_peak, 3))
    s.note(f"{steps} steps each, one after the other in this process; peak of torch.cuda.max_memory_allocated above "
           "what was allocated before (the same case as engine_vs_plain).")
    s.check("both measured", engine_peak > 0 and plain_peak > 0)
    s.number("summary", f"engine {engine_peak:,.0f} MiB, plain {plain_peak:,.0f} MiB")
