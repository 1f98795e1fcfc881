"""One benchmark configuration in a fresh process (run by ``benchmarks/run.py``, not by hand).

A fresh process per configuration makes its peak resident memory (``ru_maxrss``) its own, and lets
each configuration set Accelerate's process-wide state (mixed precision, processes) freely.

    python benchmarks/worker.py '{"case": "DCGAN width 32, batch 64", "loop": "engine", "steps": 50,
                                  "warmup": 5, "config": {"channels_last": true}}'

Keys: ``case`` (a name of ``engine_overhead.CASES``), ``loop`` ("engine", "plain", or "none":
imports only, the memory baseline), ``steps``, ``warmup``, ``threads``, ``config`` (TrainConfig
overrides, engine only), ``batch`` (overrides the case's), ``allreduce_probe`` (engine under several
processes: alternate steps with and without the gradient all-reduce, see ``AllReduceProbe``).

Prints one line per process, ``BENCH_RESULT {json}``: images/s (over all processes), median step
ms, seconds to the end of the first step (compilation included), peak RSS in MiB, peak CUDA memory
in MiB (on CUDA) and, with the probe, the share of a step spent in the gradient all-reduce.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_overhead import CASES, PlainLoop, data_for, quiet_trainer  # noqa: E402

from gan_accel import Callback  # noqa: E402

PREFIX = "BENCH_RESULT "


class AllReduceProbe:
    """A DDP communication hook that all-reduces on "on" steps and skips the all-reduce on the others.

    The step time with the all-reduce minus the step time without it is the time the step spends
    in (waiting for) the gradient all-reduce; the steps alternate, so both see the same machine
    conditions. Gradients of "off" steps stay local (the ranks drift apart: fine for timing).
    """

    def __init__(self) -> None:
        self.on = True

    def hook(self, state, bucket):
        if self.on:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            return allreduce_hook(None, bucket)
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    def attach(self, trainer) -> bool:
        """Register on every DDP-wrapped network (before the first backward); False when there is none."""
        attached = False
        for net in trainer.networks.values():
            if isinstance(net, torch.nn.parallel.DistributedDataParallel):
                net.register_comm_hook(None, self.hook)
                attached = True
        return attached


class StepTimer(Callback):
    """Seconds of each engine step after the warm-up, split by the probe's state during the step."""

    def __init__(self, warmup: int, probe: AllReduceProbe | None = None) -> None:
        self.warmup, self.probe = warmup, probe
        self.times: dict[bool, list[float]] = {True: [], False: []}
        self.mark: float | None = None
        self.first_step_s = 0.0  # includes compilation with compile=True

    def on_fit_start(self, trainer) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, trainer) -> None:
        if trainer.accelerator.device.type == "cuda":
            torch.cuda.synchronize()  # time the work, not its launch
        now = time.perf_counter()
        if trainer.step == 1:
            self.first_step_s = now - self.start
        on = self.probe.on if self.probe is not None else True
        if self.mark is not None and trainer.step > self.warmup:
            self.times[on].append(now - self.mark)
        if self.probe is not None:
            self.probe.on = not on
        self.mark = time.perf_counter()


def run_engine(spec: dict) -> tuple[list[float], dict]:
    """Step times of the engine, and extras (processes, all-reduce share)."""
    build, kind, batch = CASES[spec["case"]]
    batch = spec.get("batch", batch)
    probe = AllReduceProbe() if spec.get("allreduce_probe") else None
    timer = StepTimer(spec["warmup"], probe)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = quiet_trainer(build, data_for(kind), batch, spec["warmup"] + spec["steps"], tmp, [timer],
                                **spec.get("config", {}))
        if probe is not None and not probe.attach(trainer):
            probe = timer.probe = None
        trainer.fit()
        world, device = trainer.accelerator.num_processes, trainer.accelerator.device
    extras = {"processes": world, "batch": batch, "first_step_s": timer.first_step_s, "device": device.type}
    if device.type == "cuda":
        extras["cuda_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    if probe is not None:
        with_ar, without = statistics.median(timer.times[True]), statistics.median(timer.times[False])
        extras["allreduce_share"] = max(0.0, 1.0 - without / with_ar)
        extras["step_ms_without_allreduce"] = without * 1e3
    return timer.times[True], extras


def run_plain(spec: dict) -> tuple[list[float], dict]:
    """Step times of the hand-written loop (CPU only)."""
    build, kind, batch = CASES[spec["case"]]
    batch = spec.get("batch", batch)
    loop = PlainLoop(build, data_for(kind), batch)
    times = []
    for step in range(spec["warmup"] + spec["steps"]):
        start = time.perf_counter()
        loop.step()
        if step >= spec["warmup"]:
            times.append(time.perf_counter() - start)
    return times, {"processes": 1, "batch": batch}


def run_nothing(spec: dict) -> tuple[list[float], dict]:
    """Imports only: the baseline of peak memory (interpreter, torch, accelerate, gan_accel)."""
    return [1.0], {"processes": 1, "batch": 0}


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: VmHWM on Linux, else ru_maxrss.

    Not ru_maxrss on Linux: a child started by fork + exec inherits its parent's high-water mark in
    ru_maxrss (so every worker would report at least the benchmark driver's memory); VmHWM belongs
    to the process's own address space, which exec starts afresh.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, KiB elsewhere


def main(argv: list[str] | None = None) -> None:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    loops = {"engine": run_engine, "plain": run_plain, "none": run_nothing}
    times, extras = loops[spec.get("loop", "engine")](spec)
    step = statistics.median(times)
    result = {"rank": int(os.environ.get("RANK", 0)), "step_ms": step * 1e3,
              "images_per_s": extras["batch"] * extras["processes"] / step, "threads": torch.get_num_threads(),
              "peak_rss_mib": peak_rss_mib(), **extras}
    # One write of the whole line: under `accelerate launch` stdout may be unbuffered, and print() then writes the
    # text and its newline separately, so two ranks' rows could interleave on one line.
    sys.stdout.write(PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
