"""The benchmark suite: one run, every comparison side by side, one markdown report (docs/benchmarks.md's tables).

    python benchmarks/run.py                     # the full suite (about half an hour on 2 idle CPU cores)
    python benchmarks/run.py --quick             # a smoke run: tiny steps, batches and repeats (a minute or
                                                 # two, mostly process start-ups and one torch.compile)
    python benchmarks/run.py --sections engine options --repeats 5
    python benchmarks/run.py --data-dir /path/to/data   # a folder holding MNIST/raw (else offline digits)

Prints a line naming the machine (CPU model, cores, Python, torch, accelerate, load average), then
one markdown table per section; every number is a median over ``--repeats`` repeats. Timings only:
nothing is asserted (tests/test_benchmarks.py checks that ``--quick`` produces every section).

Sections and how each is measured:

* **engine** -- GANTrainer against a hand-written loop (pytorch/examples' DCGAN step) with the same
  models, in-memory data, batch and Adam optimizers, for DCGAN width 32 and 64 (batch 64) and an MLP
  GAN (3x128, batch 256). Both run in one process, *alternating step by step*
  (``engine_overhead.py``), so machine drift hits both alike. Targets: engine / plain >= 0.98 for
  the DCGANs, >= 0.95 for the MLP.
* **data** -- gan_accel's in-memory uint8 loader against torchvision's per-item PIL path
  (``data_throughput.py``), and the share of a CPU DCGAN step (width 64) spent fetching a batch:
  fetch / (fetch + step), without prefetch overlap.
* **options** -- the engine with one option at a time against its eager fp32 default:
  ``channels_last=True``, ``compile=True`` (torch.compile of G and D), ``mixed_precision="bf16"``
  (bf16 autocast, which runs on CPU too), ``keep_freed_memory=True`` (glibc keeps freed memory in
  the process: no page faults per step). Each configuration runs in a fresh process
  (``worker.py``); the configurations alternate within each repeat and the ratio is taken against
  the default of the same repeat. "first step" is the time to the end of step 1 (compilation).
* **processes** -- 1 process (all cores' threads) against 2 processes over gloo
  (``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2``, half the threads each),
  the case's batch per process; images/s count all processes. The all-reduce share: a DDP communication
  hook all-reduces the gradients on every other step and skips the all-reduce on the steps in
  between (``worker.AllReduceProbe``); share = 1 - median(step without) / median(step with). It is
  the time a step waits for the gradient all-reduce (what is not hidden behind the backward).
* **memory** -- peak resident memory of each configuration above, each measured in its own fresh
  process (VmHWM from /proc, ru_maxrss where there is no /proc: on Linux a forked child's ru_maxrss
  starts at its parent's), next to the baseline of a process that only imports torch and gan_accel.
* **gpu** -- with a CUDA device: the engine at eager fp32, channels_last, compile, bf16,
  channels_last + bf16 and compile + bf16 for the DCGANs (batch ``--gpu-batch``, every timed step
  synchronized): images/s and peak GPU memory (``max_memory_allocated``).
  Without one the section says "not measured (no CUDA device)".

A configuration that fails is reported in its row and the script exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from engine_overhead import CASES, compare  # noqa: E402
from worker import PREFIX  # noqa: E402

SECTIONS = {
    "engine": "Engine vs a hand-written loop (CPU)",
    "data": "Data path: in-memory loader vs torchvision per-item (CPU)",
    "options": "Options vs the eager default (CPU)",
    "processes": "1 vs 2 processes (CPU, gloo)",
    "memory": "Peak resident memory",
    "gpu": "GPU (CUDA)",
}
TARGETS = {"DCGAN width 32, batch 64": 0.98, "DCGAN width 64, batch 64": 0.98, "MLP GAN (3x128), batch 256": 0.95}
SHORT = {"DCGAN width 32, batch 64": "DCGAN w32", "DCGAN width 64, batch 64": "DCGAN w64",
         "MLP GAN (3x128), batch 256": "MLP GAN"}
OPTIONS = {
    "eager fp32 (default)": {},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
    "bf16 autocast": {"mixed_precision": "bf16"},
}
CPU_OPTIONS = {**OPTIONS, "keep_freed_memory": {"keep_freed_memory": True}}  # glibc's allocator: a CPU matter
GPU_OPTIONS = {**OPTIONS, "channels_last + bf16": {"channels_last": True, "mixed_precision": "bf16"},
               "compile + bf16": {"compile": True, "mixed_precision": "bf16"}}


@dataclass
class Plan:
    """How much each section measures (``--quick`` shrinks everything)."""

    repeats: int
    lockstep_steps: int
    lockstep_warmup: int
    worker_steps: int
    worker_warmup: int
    data_batches: int
    data_rounds: int
    cases: list[str]
    option_cases: list[str]
    worker_batch: int | None = None  # the batch of the fresh-process sections (None: the case's own)
    failures: list[str] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)  # configuration -> peak RSS MiB (max over runs)

    def batch(self) -> dict:
        """The batch override of a worker spec (empty: the case's batch)."""
        return {} if self.worker_batch is None else {"batch": self.worker_batch}


def make_plan(args: argparse.Namespace) -> Plan:
    if args.quick:
        first = [next(iter(CASES))]
        return Plan(args.repeats or 1, args.steps or 4, 1, args.steps or 4, 1, 3, 1, list(CASES), first,
                    worker_batch=16)
    return Plan(args.repeats or 3, args.steps or 200, 20, args.steps or 60, 10, 100, 3, list(CASES), list(CASES))


# -- the machine --------------------------------------------------------------------------------
def machine_line() -> str:
    import accelerate

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        physical = None
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    return (f"Machine: {cpu}; {physical or '?'} physical cores, {available} logical CPUs available; {gpu}; "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}, torch {torch.__version__}, "
            f"accelerate {accelerate.__version__}; load average {load} at start.")


# -- running one configuration in a fresh process ---------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_worker(spec: dict, plan: Plan, label: str, processes: int = 1, cpu: bool = True) -> list[dict] | None:
    """Run ``worker.py`` with ``spec`` (under ``accelerate launch`` for several processes); its per-process
    results, or None after recording the failure."""
    env = dict(os.environ)
    if cpu:
        env["ACCELERATE_USE_CPU"] = "1"
    else:
        env.pop("ACCELERATE_USE_CPU", None)
    command = [sys.executable, str(HERE / "worker.py"), json.dumps(spec)]
    if processes > 1:
        threads = max(1, (spec.get("threads") or torch.get_num_threads()) // processes)
        command[1:1] = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                        "--num_cpu_threads_per_process", str(threads), "--main_process_port", str(free_port())]
        command[-1] = json.dumps({**spec, "threads": threads})
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    rows = [json.loads(line[len(PREFIX):]) for line in result.stdout.splitlines() if line.startswith(PREFIX)]
    if result.returncode != 0 or len(rows) != processes:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()] or ["no output"]
        plan.failures.append(f"{label}: exit {result.returncode}: {lines[-1][:200]}")
        return None
    plan.memory[label] = max(plan.memory.get(label, 0.0), max(row["peak_rss_mib"] for row in rows))
    return rows


def median_of(runs: list[dict | None], key: str) -> float | None:
    values = [run[key] for run in runs if run is not None and key in run]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    return "failed" if value is None else f"{value:{spec}}{suffix}"


# -- the sections -------------------------------------------------------------------------------------
def section_engine(plan: Plan) -> list[str]:
    lines = ["| case | plain loop, images/s | engine, images/s | engine / plain | target | met |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for case in plan.cases:
        plain, engine, ratio = compare(case, plan.repeats, plan.lockstep_steps, plan.lockstep_warmup)
        target = TARGETS[case]
        lines.append(f"| {case} | {plain:,.0f} | {engine:,.0f} | {ratio:.3f}x | >= {target:.2f}x | "
                     f"{'met' if ratio >= target else 'not met'} |")
    lines.append(f"\n{plan.repeats} repeats of {plan.lockstep_steps} steps (after {plan.lockstep_warmup} warm-up "
                 "steps), engine and plain loop alternating step by step in one process.")
    return lines


def section_data(plan: Plan, data_dir: str, quick: bool) -> list[str]:
    from data_throughput import LABELS, measure_paths

    from gan_accel.data import resolve_dataset

    # --quick: the offline digits (4,096), so the smoke run needs no data and loads in no time
    info = resolve_dataset("digits" if quick else "auto", data_dir, download=False, log=None,
                           offline_size=4096 if quick else 60_000)
    batch = 128
    results = measure_paths(info, data_dir, batch, plan.data_batches, plan.data_rounds, train_steps=1 if quick else 5)
    step_s = results["step_s"]
    lines = ["| data path | images/s | ms / batch | data wait share of a DCGAN w64 step |",
             "| --- | ---: | ---: | ---: |"]
    for name, label in LABELS.items():
        rate = statistics.median(r[0] for r in results[name])
        fetch = statistics.median(r[1] for r in results[name])
        lines.append(f"| {label} | {rate:,.0f} | {fetch * 1e3:.2f} | {fetch / (fetch + step_s):.1%} |")
    lines.append(f"\n{info.name} ({len(info):,} images), batch {batch}, {results['batches']} batches x "
                 f"{plan.data_rounds} rounds (paths alternating); CPU DCGAN w64 step {step_s * 1e3:.0f} ms "
                 "(one D and one G Adam update); share = fetch / (fetch + step).")
    return lines


def section_options(plan: Plan) -> list[str]:
    lines = ["| model | option | images/s | vs eager default | first step, s |", "| --- | --- | ---: | ---: | ---: |"]
    for case in plan.option_cases:
        # channels_last changes nothing without 4-D weights: not run for the MLP
        options = {name: cfg for name, cfg in CPU_OPTIONS.items() if not (case.startswith("MLP") and "channels_last" in cfg)}
        runs: dict[str, list[dict | None]] = {name: [] for name in options}
        for repeat in range(plan.repeats):
            names = list(options)
            names = names[repeat % len(names):] + names[:repeat % len(names)]  # rotate the order
            for name in names:
                spec = {"case": case, "loop": "engine", "steps": plan.worker_steps, "warmup": plan.worker_warmup,
                        "config": options[name], **plan.batch()}
                rows = run_worker(spec, plan, f"engine, {SHORT[case]}, {name}")
                runs[name].append(rows[0] if rows else None)
        base = runs["eager fp32 (default)"]
        for name in options:
            ratios = [r["images_per_s"] / b["images_per_s"] for r, b in zip(runs[name], base) if r and b]
            lines.append(f"| {SHORT[case]} | {name} | {fmt(median_of(runs[name], 'images_per_s'))} | "
                         f"{fmt(statistics.median(ratios) if ratios else None, '.3f', 'x')} | "
                         f"{fmt(median_of(runs[name], 'first_step_s'), '.1f')} |")
    batch = f"batch {plan.worker_batch}" if plan.worker_batch else "the cases' batches"
    lines.append(f"\nEach configuration in a fresh process, {batch}, {plan.repeats} repeats of {plan.worker_steps} "
                 "steps "
                 f"(after {plan.worker_warmup} warm-up steps), configurations alternating; channels_last is "
                 "not run for the MLP (no 4-D weights: it changes nothing).")
    return lines


def section_processes(plan: Plan) -> list[str]:
    case = next(iter(CASES))
    threads = torch.get_num_threads()
    spec = {"case": case, "loop": "engine", "steps": plan.worker_steps, "warmup": plan.worker_warmup, **plan.batch()}
    one, two = [], []
    for _ in range(plan.repeats):
        rows = run_worker(spec, plan, f"engine, {SHORT[case]}, 1 process")
        one.append(rows[0] if rows else None)
        rows = run_worker({**spec, "allreduce_probe": True}, plan, f"engine, {SHORT[case]}, 2 processes (each)",
                          processes=2)
        two.append(rows[0] if rows else None)
    base = median_of(one, "images_per_s")
    pair = median_of(two, "images_per_s")
    lines = ["| processes | threads each | images/s (all processes) | vs 1 process | step, ms | "
             "gradient all-reduce share of a step |", "| --- | ---: | ---: | ---: | ---: | ---: |",
             f"| 1 | {threads} | {fmt(base)} | 1.000x | {fmt(median_of(one, 'step_ms'), '.1f')} | - |",
             f"| 2 (gloo) | {max(1, threads // 2)} | {fmt(pair)} | "
             f"{fmt(pair / base if pair and base else None, '.3f', 'x')} | {fmt(median_of(two, 'step_ms'), '.1f')} | "
             f"{fmt(median_of(two, 'allreduce_share'), '.1%')} |",
             f"\n{SHORT[case]}, batch {plan.worker_batch or CASES[case][2]} per process, {plan.repeats} repeats of "
             f"{plan.worker_steps} steps; "
             "all-reduce share = 1 - step without / step with the gradient all-reduce (steps alternating, "
             "a DDP communication hook)."]
    return lines


def section_memory(plan: Plan) -> list[str]:
    run_worker({"case": next(iter(CASES)), "loop": "none"}, plan, "baseline: torch + gan_accel imported, no training")
    for case in plan.option_cases:
        run_worker({"case": case, "loop": "plain", "steps": plan.worker_steps, "warmup": plan.worker_warmup,
                    **plan.batch()}, plan, f"plain loop, {SHORT[case]}")
    baseline = plan.memory.get("baseline: torch + gan_accel imported, no training")
    lines = ["| configuration | peak RSS, MiB | above the baseline, MiB |", "| --- | ---: | ---: |"]
    for label, mib in sorted(plan.memory.items(), key=lambda item: (not item[0].startswith("baseline"), item[0])):
        lines.append(f"| {label} | {mib:,.0f} | {fmt(mib - baseline if baseline else None, ',.0f')} |")
    lines.append("\nPeak resident memory (VmHWM) of a fresh process per configuration (the largest over repeats; "
                 "for 2 processes, the larger rank).")
    return lines


def section_gpu(plan: Plan, batch: int) -> list[str]:
    if not torch.cuda.is_available():
        return ["not measured (no CUDA device)"]
    lines = ["| model | option | images/s | vs eager default | peak GPU memory, MiB | first step, s |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for case in [c for c in plan.option_cases if c.startswith("DCGAN")]:
        runs: dict[str, list[dict | None]] = {name: [] for name in GPU_OPTIONS}
        for _ in range(plan.repeats):
            for name, config in GPU_OPTIONS.items():
                spec = {"case": case, "loop": "engine", "steps": plan.worker_steps, "warmup": plan.worker_warmup,
                        "config": config, "batch": batch}
                rows = run_worker(spec, plan, f"GPU engine, {SHORT[case]}, {name}", cpu=False)
                runs[name].append(rows[0] if rows else None)
        base = median_of(runs["eager fp32 (default)"], "images_per_s")
        for name in GPU_OPTIONS:
            rate = median_of(runs[name], "images_per_s")
            lines.append(f"| {SHORT[case]}, batch {batch} | {name} | {fmt(rate)} | "
                         f"{fmt(rate / base if rate and base else None, '.3f', 'x')} | "
                         f"{fmt(median_of(runs[name], 'cuda_peak_mib'), ',.0f')} | "
                         f"{fmt(median_of(runs[name], 'first_step_s'), '.1f')} |")
    lines.append(f"\n{torch.cuda.get_device_name(0)}; each configuration in a fresh process, every step synchronized.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny steps and repeats: checks the suite runs")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3, quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default: per section)")
    parser.add_argument("--sections", nargs="*", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--data-dir", default=os.environ.get("GAN_ACCEL_DATA_DIR", "./data"),
                        help="folder holding MNIST/raw; without it the data section uses the offline digits")
    parser.add_argument("--gpu-batch", type=int, default=256, help="batch of the GPU section")
    args = parser.parse_args(argv)
    os.environ["ACCELERATE_USE_CPU"] = "1"  # the CPU sections stay on CPU on a CUDA machine too (gpu: per worker)
    plan = make_plan(args)
    start = time.perf_counter()
    print(f"## gan_accel benchmarks{' (--quick: smoke run, numbers not meaningful)' if args.quick else ''}\n")
    print(machine_line() + f" Medians of {plan.repeats} repeat(s).\n", flush=True)
    for key in SECTIONS:
        if key not in args.sections:
            continue
        began = time.perf_counter()
        if key == "memory":
            lines = section_memory(plan)
        elif key == "data":
            lines = section_data(plan, args.data_dir, args.quick)
        elif key == "gpu":
            lines = section_gpu(plan, args.gpu_batch)
        else:
            lines = {"engine": section_engine, "options": section_options, "processes": section_processes}[key](plan)
        print(f"### {SECTIONS[key]}\n\n" + "\n".join(lines) + "\n", flush=True)
        print(f"<!-- {key}: {time.perf_counter() - began:.0f} s -->\n", flush=True)
    for failure in plan.failures:
        print(f"FAILED {failure}")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 1 if plan.failures else 0


if __name__ == "__main__":
    sys.exit(main())
