"""The benchmark suite runs end to end: ``benchmarks/run.py --quick`` prints its report with every section.

Only the report's shape is checked, never its numbers (timings belong in docs/benchmarks.md, not in asserts).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def section_titles() -> dict[str, str]:
    """The SECTIONS table of benchmarks/run.py, read without importing it."""
    for node in ast.parse(RUN.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SECTIONS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("benchmarks/run.py has no SECTIONS table")


def import_benchmark(name: str):
    """A module of benchmarks/ (they import each other by bare name)."""
    sys.path.insert(0, str(RUN.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(RUN.parent))


@pytest.mark.slow  # fresh processes (one a 2-process launch): about half a minute on 2 cores
def test_quick_benchmark_prints_the_machine_and_a_table_for_every_section():
    # The options section (a fresh process per option, one of them a first torch.compile) is the next test's,
    # in-process: every other section runs here for real, fresh worker processes and the 2-process launch included.
    # One thread per process, like the other launched processes of the suite: the quick run's numbers are not
    # read, and on a 2-core machine shared with other work two threads per worker wait on each other.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    titles = section_titles()
    assert set(titles) == {"engine", "data", "options", "processes", "memory", "gpu"}
    run = [key for key in titles if key != "options"]
    result = subprocess.run([sys.executable, str(RUN), "--quick", "--sections", *run], capture_output=True, text=True,
                            timeout=1500, env=env)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "## gan_accel benchmarks" in out and "Machine: " in out and "torch " in out and "accelerate " in out
    assert f"### {titles['options']}" not in out  # --sections is obeyed
    for key in run:
        header = f"### {titles[key]}"
        assert header in out, f"section {key!r} missing"
        body = out.split(header, 1)[1].split("\n### ", 1)[0]
        if key == "gpu" and not torch.cuda.is_available():
            assert "not measured (no CUDA device)" in body
        else:
            assert "| --- |" in body and "failed" not in body, f"section {key!r}:\n{body}"
    for word in ("target", "met", "all-reduce share", "peak RSS", "baseline: torch + gan_accel imported",
                 "plain loop, DCGAN w32", "2 processes (each)"):
        assert word in out


def test_quick_options_section_runs_every_option_against_the_default_of_its_repeat(monkeypatch):
    """The options section's table from its workers' rows (a stand-in for the fresh processes, whose own
    code the previous test runs): one fresh worker per option and repeat, ratios against the same repeat's
    default, channels_last never for the MLP."""
    run = import_benchmark("run")
    specs: list[dict] = []
    rates = {(): 100.0, ("channels_last",): 110.0, ("compile",): 150.0, ("mixed_precision",): 80.0,
             ("keep_freed_memory",): 120.0}

    def worker(spec, plan, label, processes=1, cpu=True):
        assert processes == 1 and cpu and spec["loop"] == "engine" and spec["batch"] == 16
        specs.append(spec)
        repeat = 1 + sum(s["case"] == spec["case"] and s["config"] == spec["config"] for s in specs[:-1])
        return [{"images_per_s": rates[tuple(spec["config"])] * repeat, "first_step_s": 2.5,
                 "peak_rss_mib": 700.0}]

    monkeypatch.setattr(run, "run_worker", worker)
    plan = run.make_plan(run.argparse.Namespace(quick=True, repeats=2, steps=None))
    plan.option_cases = list(run.CASES)
    out = "\n".join(run.section_options(plan))
    configs = {case: [s["config"] for s in specs if s["case"] == case] for case in run.CASES}
    for case, seen in configs.items():
        expected = [c for c in run.CPU_OPTIONS.values() if not (case.startswith("MLP") and "channels_last" in c)]
        assert sorted(map(str, seen)) == sorted(map(str, expected * 2)), case  # every option, each repeat
        assert seen[:len(expected)] != seen[len(expected):]  # the second repeat rotates the order
    for name, ratio in (("channels_last", "1.100x"), ("compile", "1.500x"), ("bf16 autocast", "0.800x"),
                        ("keep_freed_memory", "1.200x"), ("eager fp32 (default)", "1.000x")):
        assert f"| DCGAN w32 | {name} | " in out and ratio in out.split(f"| DCGAN w32 | {name} | ", 1)[1].split("\n")[0]
    assert "| MLP GAN | channels_last |" not in out and "| MLP GAN | compile |" in out
    assert "failed" not in out


def test_engine_overhead_control_steps_two_copies_of_the_plain_loop_alike(capsys, monkeypatch):
    """``engine_overhead.py --control``: the protocol's null reading, two plain loops in lockstep.
    Each copy is stepped the same number of times (so B / A compares like with like)."""
    engine_overhead = import_benchmark("engine_overhead")
    steps: list[int] = []
    real_step = engine_overhead.PlainLoop.step

    def counted(self):
        steps.append(id(self))
        return real_step(self)

    monkeypatch.setattr(engine_overhead.PlainLoop, "step", counted)
    engine_overhead.main(["--control", "--steps", "3", "--warmup", "1", "--repeats", "1",
                          "--cases", "MLP GAN (3x128), batch 256"])
    out = capsys.readouterr().out
    assert "| case | plain loop A, images/s | plain loop B, images/s | B / A |" in out
    row = next(line for line in out.splitlines() if line.startswith("| MLP GAN"))
    a, b, ratio = (float(cell.replace(",", "")) for cell in row.strip("| ").split(" | ")[1:])
    assert ratio == pytest.approx(b / a, rel=0.01)
    assert len(set(steps)) == 2 and steps.count(steps[0]) == steps.count(steps[1]) == 4  # warmup 1 + 3 steps
    assert steps[::2] == [steps[0]] * 4  # A always first, then B


def test_engine_overhead_keep_freed_memory_sets_glibcs_thresholds_before_measuring(capsys, monkeypatch):
    """``engine_overhead.py --keep-freed-memory``: mallopt is called before either side runs, and the
    header says so (the real mallopt is process-wide, so a recorder stands in for it here)."""
    from gan_accel.engine import speed

    engine_overhead = import_benchmark("engine_overhead")
    calls: list[tuple[int, int]] = []
    steps_before_mallopt: list[int] = []
    real_step = engine_overhead.PlainLoop.step
    monkeypatch.setattr(engine_overhead.PlainLoop, "step",
                        lambda self: (steps_before_mallopt.append(len(calls)), real_step(self))[1])
    monkeypatch.setattr(speed, "_glibc_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    engine_overhead.main(["--control", "--keep-freed-memory", "--steps", "2", "--warmup", "1", "--repeats", "1",
                          "--cases", "MLP GAN (3x128), batch 256"])
    out = capsys.readouterr().out
    assert sorted(calls) == [(-3, 1 << 30), (-1, 1 << 30)]
    assert steps_before_mallopt and set(steps_before_mallopt) == {2}  # every step ran after both calls
    assert "glibc keeps freed memory (keep_freed_memory)" in out.splitlines()[0]
