"""What the divergence guard costs, and the two ways it could decide: side by side in one process.

Three trainers of the same GAN, built alike, their runners stepped *alternately* (the order rotating
every step, so none always goes first) under the same machine conditions:

* ``device``: the engine as it is: the verdict a device tensor, the update skipped on the device, the
  buffers selected back, the counters on the device (no host read in a step).
* ``host``: the other design, for the measurement only: the verdict read on the host (the loss by
  ``item()``, the gradients by the same kernel into a reused buffer), the update skipped by an ``if``,
  the buffers copied back on a skip, the counters Python ints.
* ``off``: ``nan_guard=False``.

The table gives each one's median step time per repeat and the median over repeats of the ratios.

    python benchmarks/guard_overhead.py [--case mlp|dcgan] [--repeats 5] [--steps 400]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_overhead import CASES, data_for, quiet_trainer  # noqa: E402

VARIANTS = ("device", "host", "off")
CASE_NAMES = {"mlp": "MLP GAN (3x128), batch 256", "dcgan": "DCGAN width 32, batch 64"}


def read_on_host(runner) -> None:
    """Make ``runner`` decide on the host: the verdict a bool, the skip an ``if`` (the design not taken)."""
    found, one, counts = torch.zeros(()), torch.ones(()), {name: [0, 0] for name in runner.nets}
    saved: list[torch.Tensor] = []
    # (G's forward made ahead holds G's buffers in its graph: here only the other networks' come back)
    buffers = [b for name, net in runner.nets.items() if name != "G" for b in net.buffers()]

    def verdict(name, optimizer, window_loss, new_data):
        skip = not math.isfinite(window_loss.item())
        grads = [p.grad for p in runner._trainable[name] if p.grad is not None]
        if not skip and grads:
            found.zero_()
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
            skip = bool(found)
        counts[name] = [counts[name][0] + 1 if skip else 0, counts[name][1] + skip]
        return skip

    def save(uses_hoisted_forward=False):
        saved[:] = [b.detach().clone() for b in buffers]

    def restore(skip):
        if skip:
            torch._foreach_copy_(buffers, saved)

    runner._verdict = verdict
    runner.skippable.step = lambda optimizer, skip: None if skip else optimizer.step()
    runner.buffers.save, runner.buffers.save_hoisted, runner.buffers.restore_where = save, lambda hoisting: None, restore


def trainer(tmp: str, variant: str, case: str):
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    build, kind, batch = CASES[case]
    t = quiet_trainer(build, data_for(kind), batch, 10**6, tmp, nan_guard=variant != "off")
    if variant == "host":
        read_on_host(t.runner)
    t.runner.batches = iter(t.data)
    return t


def measure(case: str, steps: int, warmup: int) -> list[float]:
    """Median step seconds of each of VARIANTS, stepped alternately in one process."""
    with tempfile.TemporaryDirectory() as tmp:
        trainers = [trainer(os.path.join(tmp, v), v, case) for v in VARIANTS]
        times: list[list[float]] = [[] for _ in VARIANTS]
        for index in range(warmup + steps):
            shift = index % len(trainers)
            for j in [*range(shift, len(trainers)), *range(shift)]:
                start = time.perf_counter()
                trainers[j].runner.run_step(lambda phase: None)
                if index >= warmup:
                    times[j].append(time.perf_counter() - start)
        return [statistics.median(t) for t in times]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=list(CASE_NAMES), default="mlp")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    case = CASE_NAMES[args.case]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads; {case}; "
          f"{args.repeats} repeats of {args.steps} steps, medians\n")
    print("| repeat | device, ms/step | host, ms/step | off, ms/step | device / host | device / off |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for repeat in range(args.repeats):
        device, host, off = measure(case, args.steps, args.warmup)
        rows.append((device / host, device / off))
        print(f"| {repeat + 1} | {device * 1e3:.3f} | {host * 1e3:.3f} | {off * 1e3:.3f} | {device / host:.3f} "
              f"| {device / off:.3f} |", flush=True)
    print(f"\nmedian device / host: {statistics.median(r[0] for r in rows):.3f}, "
          f"device / off: {statistics.median(r[1] for r in rows):.3f}")


if __name__ == "__main__":
    main()
