"""Sections that run what a user runs: the default `gan-accel train` at 64 px (the recipe's first minutes)
and the quickstart example at its defaults and with the fast options."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from make_rgb_digits import make_rgb_digits  # benchmarks/: the coloured digits, offline

from .fixtures import ROOT, Run, child_env, read_metrics_of, reset_accelerate
from .report import Report, Section

ENTRY = ROOT / "benchmarks" / "gpu_check.py"  # runs quickstart_driver in a fresh process (--quickstart-driver)


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
    env = child_env(as_shipped=True)  # without the proofs' CUBLAS setting: the default command as shipped
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

    for key, pattern in (("recipe", r"the recipe for .*"), ("model", r"\S+ G and D \(.*")):
        found = re.search(pattern, log)
        s.number(key, found.group(0) if found else "not printed")
    rows = read_metrics_of(out)
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
            done = subprocess.run([sys.executable, str(ENTRY), "--quickstart-driver", json.dumps(spec)],
                                  env=child_env(as_shipped=True), capture_output=True, text=True,
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
    result: dict[str, Any] = {"wall_s": round(wall, 1)}
    found = re.search(r"gan_accel: (\S+) \((\d+) images from (.+?)\); (\d+) steps of (\d+)", stdout)
    if found:
        result.update(dataset=found.group(1), steps=int(found.group(4)), batch=int(found.group(5)))
    rows = read_metrics_of(out)
    speeds = [r["images/s"] for r in rows[1:] or rows if "images/s" in r]
    if speeds:
        result["images_per_s"] = round(statistics.median(speeds), 1)
    if (out / "eval.json").exists():
        scores = json.loads((out / "eval.json").read_text())
        result.update({k: round(scores[k], 4) for k in ("fd", "kid", "precision", "recall", "mean_confidence",
                                                         "class_entropy", "min_class_share", "max_class_share")
                       if k in scores})
    return result
