"""Your own images through gan_accel.data.open_image_data: raw decode against the cache, and the data wait of a step.

    python benchmarks/image_data.py                    # 10,000 RGB digits at 64 px, made first in a temp folder
    python benchmarks/image_data.py --data photos/     # your own folder (or .zip, or hf:NAME)
    python benchmarks/image_data.py --quick            # a smoke run in seconds (tests/test_image_data_benchmark.py)

The set (without ``--data``): ``make_rgb_digits.py`` (MNIST digits in colour on coloured backgrounds,
PNG files in class folders 0-9), and a copy of it as a ZIP. Three tables, timings only:

1. **images/s at the resolution** (``--resolution``, 64): the cache build (scan + decode of every file,
   once), per-item decoding in the DataLoader (``memory_budget=0``) with 0, 1 and 2 worker processes,
   the same from the ZIP and through ``datasets``' ``imagefolder`` (when installed), and the
   memory-mapped cache. Loaders alternate within each of ``--rounds`` rounds (best round reported), so
   machine drift hits them alike; the first batch of each round (worker start-up) is not timed.
2. **data wait share of a training step**: GANTrainer with DCGAN (``--width``) at the resolution, RGB,
   ``--batch-size``, fed by the cache and by per-item decoding in 2 workers; the time the loop waits
   for its next batch over the time of the steps (after ``--warmup`` steps). Target: at most 5 %.
3. **bad files**: the same set with ``--corrupt-fraction`` of its files broken (truncated, not images,
   empty, random bytes): what the scan skipped, and the one warning line.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from make_rgb_digits import make_rgb_digits  # noqa: E402

from gan_accel import Callback, GANTrainer, TrainConfig  # noqa: E402
from gan_accel.data import open_image_data  # noqa: E402
from gan_accel.models import DCGANDiscriminator, DCGANGenerator  # noqa: E402

QUIET = ("sample_saver", "training_plot", "checkpointer", "weights_exporter", "progress_bar", "signal_handler")
TARGET_WAIT_SHARE = 0.05


def loader_rate(loader: Any, batches: int) -> float:
    """Images/s over ``batches`` batches of a fresh epoch, after one untimed batch (worker start-up)."""
    iterator = iter(loader)
    next(iterator)
    seen, start = 0, time.perf_counter()
    for _ in range(batches):
        batch = next(iterator, None)
        if batch is None:
            break
        seen += (batch[0] if isinstance(batch, (tuple, list)) else batch).shape[0]
    return seen / (time.perf_counter() - start)


def throughput(sources: dict[str, Any], cache: Path, resolution: int, batch: int, batches: int,
               rounds: int, log) -> list[tuple[str, float]]:
    """(loader name, best images/s) for every loader; see the module docstring."""
    rows: list[tuple[str, float]] = []
    folder = sources["folder"]
    start = time.perf_counter()
    cached = open_image_data(folder, resolution, cache_dir=cache, log=log)
    build_s = time.perf_counter() - start
    rows.append((f"cache build: scan + decode of {len(cached):,} files, once (default build workers)",
                 len(cached) / build_s))
    start = time.perf_counter()
    open_image_data(folder, resolution, cache_dir=cache, log=None)
    rows.append(("cache hit: open_image_data again (listing + JSON, no decode)",
                 len(cached) / (time.perf_counter() - start)))

    per_item = open_image_data(folder, resolution, cache_dir=cache, memory_budget=0, log=None)
    loaders: dict[str, Any] = {}
    for workers in (0, 1, 2):
        loaders[f"decode per item, {workers} DataLoader workers"] = per_item.dataloader(batch, num_workers=workers)
    if sources.get("zip"):
        zipped = open_image_data(sources["zip"], resolution, cache_dir=cache, memory_budget=0, log=None)
        loaders["decode per item from the ZIP, 0 workers"] = zipped.dataloader(batch, num_workers=0)
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.config.HF_DATASETS_CACHE = cache / "hf"  # its arrow copy goes with the benchmark's files
        hub = open_image_data(f"hf:{folder}", resolution, cache_dir=cache, memory_budget=0, log=None)
        loaders["decode per item through datasets' imagefolder, 0 workers"] = hub.dataloader(batch, num_workers=0)
    except ImportError:
        rows.append(("datasets' imagefolder: not measured (datasets not installed)", float("nan")))
    loaders["memory-mapped cache (uint8 gather), 0 workers"] = cached.dataloader(batch, num_workers=0)
    batches = min(batches, len(cached) // batch - 1)
    measured: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(rounds):
        for name, loader in loaders.items():
            measured[name].append(loader_rate(loader, batches))
    rows += [(name, max(rates)) for name, rates in measured.items()]
    return rows


class StepClock(Callback):
    """Time between consecutive ``on_step_end`` calls (one training step each), after ``warmup`` steps."""

    name = "step_clock"

    def __init__(self, warmup: int) -> None:
        self.warmup, self.mark, self.times = warmup, None, []

    def on_step_end(self, trainer) -> None:
        now = time.perf_counter()
        if self.mark is not None and trainer.step > self.warmup:
            self.times.append(now - self.mark)
        self.mark = now


class TimedStream:
    """The trainer's batch stream, timing each wait for the next batch (the rest delegates to the stream)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.waits = stream, []

    def __iter__(self):
        iterator = iter(self.stream)
        while True:
            start = time.perf_counter()
            batch = next(iterator)
            self.waits.append(time.perf_counter() - start)
            yield batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def wait_share(data: Any, width: int, batch: int, steps: int, warmup: int, workers: int) -> tuple[float, float, float]:
    """(data wait share of a step, median step seconds, training images/s) of GANTrainer fed by ``data``."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(0)
    r, c = data.prep.resolution, data.prep.channels
    G = DCGANGenerator(z_dim=100, width=width, image_size=r, channels=c)
    D = DCGANDiscriminator(width=width, image_size=r, channels=c)
    clock = StepClock(warmup)
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(max_steps=warmup + steps, batch_size=batch, lr_schedule="constant", warmup_ratio=0.0,
                             log_every=10**9, sample_every=10**9, checkpoint_every=10**9, output_dir=out,
                             progress_bar=False)
        trainer = GANTrainer(G, D, data.dataloader(batch, num_workers=workers, random_flip=True), config,
                             callbacks=[clock], disable_callbacks=QUIET)
        timed = TimedStream(trainer.data)
        trainer.data = timed
        trainer.fit()
    waits = timed.waits[warmup + 1: warmup + 1 + len(clock.times)]  # one batch per step (default phases)
    share = sum(waits) / sum(clock.times)
    return share, statistics.median(clock.times), batch / statistics.median(clock.times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="a folder, .zip or hf:NAME (default: make the RGB digits)")
    parser.add_argument("--num", type=int, default=10_000, help="images made without --data (default 10,000)")
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=50, help="timed batches per loader and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=64, help="DCGAN width of the training step")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per data path")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--corrupt-fraction", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny set, few batches and steps")
    parser.add_argument("--verbose", action="store_true", help="show open_image_data's own lines")
    args = parser.parse_args(argv)
    if args.quick:
        args.num, args.batch_size, args.batches, args.rounds = 384, 16, 4, 1
        args.width, args.steps, args.warmup = 8, 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    log = print if args.verbose else None

    work = Path(tempfile.mkdtemp(prefix="gan_accel_image_bench_"))
    try:
        cache = work / "cache"
        if args.data is None:
            made = make_rgb_digits(work / "digits", args.num, args.resolution, seed=0, zip_path=work / "digits.zip")
            sources = {"folder": made["out"], "zip": made["zip"]}
            what = f"{args.num:,} RGB digits at {args.resolution} px ({made['source']}, make_rgb_digits.py)"
        else:
            sources = {"folder": args.data}
            what = args.data
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
        print(f"\ndata: {what}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
              f"{torch.__version__}, {torch.get_num_threads()} threads, load average {load}; batch {args.batch_size}"
              f"{' (--quick: numbers mean nothing)' if args.quick else ''}\n")

        rows = throughput(sources, cache, args.resolution, args.batch_size, args.batches, args.rounds, log)
        print(f"| data path at {args.resolution} px | images/s |")
        print("|---|---:|")
        for name, rate in rows:
            print(f"| {name} | {'n/a' if rate != rate else f'{rate:,.0f}'} |")
        best_decode = max(rate for name, rate in rows if name.startswith("decode per item, "))
        cache_rate = next(rate for name, rate in rows if name.startswith("memory-mapped"))
        print(f"\ncached / best per-item decode: {cache_rate / best_decode:.1f}x\n")

        cached = open_image_data(sources["folder"], args.resolution, cache_dir=cache, log=None)
        per_item = open_image_data(sources["folder"], args.resolution, cache_dir=cache, memory_budget=0, log=None)
        print(f"| data path (DCGAN width {args.width}, {args.resolution} px, {cached.prep.channels} channels, batch "
              f"{args.batch_size}) | data wait share of a step | step ms (median) | training images/s | target "
              f"<= {TARGET_WAIT_SHARE:.0%} |")
        print("|---|---:|---:|---:|---|")
        for name, data, workers in (("memory-mapped cache, 0 workers", cached, 0),
                                    ("decode per item, 2 workers", per_item, 2)):
            share, step_s, rate = wait_share(data, args.width, args.batch_size, args.steps, args.warmup, workers)
            print(f"| {name} | {share:.2%} | {step_s * 1e3:,.0f} | {rate:,.0f} | "
                  f"{'met' if share <= TARGET_WAIT_SHARE else 'NOT met'} |")

        if args.data is None and args.corrupt_fraction > 0:
            num = max(200, args.num // 4)
            bad = make_rgb_digits(work / "corrupt", num, args.resolution, seed=1,
                                  corrupt_fraction=args.corrupt_fraction)
            lines: list[str] = []
            start = time.perf_counter()
            data = open_image_data(bad["out"], args.resolution, cache_dir=cache, log=lines.append)
            seconds = time.perf_counter() - start
            warning = next((line for line in lines if "warning" in line), "(no warning)")
            print(f"\n| {args.corrupt_fraction:.0%} of {num:,} files broken | value |\n|---|---:|")
            print(f"| files broken by the generator | {len(bad['corrupt']):,} |")
            print(f"| files skipped by the scan and build | {len(data.skipped_files):,} |")
            print(f"| images trained on | {len(data):,} |")
            print(f"| scan + cache build, s | {seconds:.2f} |")
            print(f"\n{warning.replace(str(work), '<tmp>')}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n(timings from one run; on a shared machine they move by tens of percent between runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
