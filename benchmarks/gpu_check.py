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

The correctness sections build their reference independently, in plain PyTorch inside this check
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

This file holds the options, the section table and the driver; the sections live in
``benchmarks/gpu_checks/``: ``proofs`` (accumulation, twin, resume), ``precision`` (fp16, bf16, penalties,
guard), ``device_features`` (env, channels_last, compile, checkpoint, evaluator), ``speed`` (engine_vs_plain,
syncs, memory) and ``commands`` (recipe, quickstart), over ``report`` and ``fixtures``.

Single process only: the multi-GPU parts (DDP with ``broadcast_buffers=False`` and BatchNorm, the
asynchronous stop flag) need two GPUs and are listed as not covered in the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(ROOT), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402

# benchmarks/gpu_checks: the report, what the sections share, and the sections by group
from gpu_checks.commands import quickstart_driver, sec_quickstart, sec_recipe  # noqa: E402
from gpu_checks.device_features import (sec_channels_last, sec_checkpoint, sec_compile, sec_env,  # noqa: E402
                                        sec_evaluator)
from gpu_checks.fixtures import CUBLAS_SET_HERE, NONDETERMINISTIC, Run, free_memory, reset_accelerate  # noqa: E402
from gpu_checks.precision import sec_bf16, sec_fp16, sec_guard, sec_penalties  # noqa: E402
from gpu_checks.proofs import sec_accumulation, sec_resume, sec_twin  # noqa: E402
from gpu_checks.report import REPORT_JSON, REPORT_MD, Report, Section, SectionTimeout, Skip  # noqa: E402,F401
from gpu_checks.speed import sec_engine_vs_plain, sec_memory, sec_syncs  # noqa: E402


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
    free_memory(run)


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
