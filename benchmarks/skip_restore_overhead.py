"""What putting back the buffers of a skipped update costs: the runner with and without it, side by side.

Two trainers of the same DCGAN (BatchNorm in G and D: the buffers a skip puts back), built alike; the
one without has an empty ``runner.buffers`` (no copies at a phase's start, nothing put back: the runner as
it was before). Their runners are stepped *alternately* in one process (one step of A, one of B), so
both see the same machine conditions step by step, and the table gives the median step time of each
and the median over repeats of the ratio B / A. ``--device-path`` takes the path a GPU takes on the
CPU (the skip decided by a device flag, the buffers put back by a select: no host read), the one
whose cost is paid every step.

``--control`` runs both sides without: the ratio it prints is what the protocol reads when there is no
difference (the first-built trainer may be the slower, whatever it runs).

    python benchmarks/skip_restore_overhead.py [--repeats 3] [--steps 150] [--device-path] [--control]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_overhead import dcgan, data_for, quiet_trainer  # noqa: E402


def trainer(tmp: str, restore: bool, device_path: bool, batch: int, width: int):
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    t = quiet_trainer(dcgan(width), data_for("image"), batch, 10**6, tmp)
    if not restore:  # no buffers to copy or put back: the runner as it was before
        from gan_accel.engine.buffer_restore import BufferRestore

        t.runner.buffers = BufferRestore({})
    if device_path:
        t.runner.skippable.cpu_mode = "device"
    t.runner.batches = iter(t.data)
    return t


def measure(steps: int, warmup: int, device_path: bool, batch: int, width: int,
            control: bool = False) -> tuple[float, float]:
    """Median step seconds of (with, without), stepped alternately (``control``: without on both sides)."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        with_restore = trainer(a, not control, device_path, batch, width)
        without = trainer(b, False, device_path, batch, width)
        times: tuple[list[float], list[float]] = ([], [])
        for index in range(warmup + steps):
            pairs = ((with_restore, times[0]), (without, times[1]))
            for t, kept in pairs if index % 2 else pairs[::-1]:  # A B, B A, ...: neither always goes first
                start = time.perf_counter()
                t.runner.run_step(lambda phase: None)
                if index >= warmup:
                    kept.append(time.perf_counter() - start)
        assert with_restore.runner.buffers.active != control
        return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--device-path", action="store_true", help="the GPU's path on the CPU: a select every step")
    parser.add_argument("--control", action="store_true",
                        help="both sides without: the protocol's null reading (what no difference reads as)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads; DCGAN width "
          f"{args.width}, batch {args.batch}; {'device' if args.device_path else 'host'} path; {args.repeats} repeats "
          f"of {args.steps} steps, medians\n")
    print("| repeat | with restore, ms/step | without, ms/step | without / with |")
    print("| --- | ---: | ---: | ---: |")
    ratios = []
    for repeat in range(args.repeats):
        with_restore, without = measure(args.steps, args.warmup, args.device_path, args.batch, args.width, args.control)
        ratios.append(without / with_restore)
        print(f"| {repeat + 1} | {with_restore * 1e3:.2f} | {without * 1e3:.2f} | {without / with_restore:.3f} |",
              flush=True)
    print(f"\nmedian without / with: {statistics.median(ratios):.3f} (1.000: no cost; below 1: the restore costs)")


if __name__ == "__main__":
    main()
