"""``benchmarks/gpu_check.py`` keeps working between GPU runs: its CPU mode runs every section (or says why
not), the CPU-runnable correctness checks pass, and its report machinery isolates failures and time.

The check's own numbers (speeds, scores) are never asserted; its correctness checks are, because each
compares the engine with an independent computation made inside the script.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gpu_check  # noqa: E402
from gpu_checks import commands, fixtures, speed  # noqa: E402  (the sections' package, next to the entry point)

sys.path.remove(str(BENCHMARKS))

# What the CPU can prove (fp16 through a CPU GradScaler and CPU fp16 autocast: see the script's docstring).
CORRECTNESS = ("accumulation", "twin", "resume", "fp16", "bf16", "penalties", "guard", "channels_last", "compile",
               "checkpoint", "evaluator")


@pytest.mark.slow  # ~16 small trainings, a sampling process and two quickstart runs: 1-2 min on 2 loaded cores
def test_cpu_quick_run_reports_every_section_and_its_correctness_checks_pass(tmp_path, monkeypatch):
    from conftest import mnist_dir

    # no cached MNIST classifier: the quickstart's scores are skipped (with a note), as on a fresh machine
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "report"
    start = time.monotonic()
    code = gpu_check.main(["--device", "cpu", "--quick", "--out", str(out), "--data-dir",
                           mnist_dir() or str(tmp_path / "no_mnist")])
    report = json.loads((out / gpu_check.REPORT_JSON).read_text())
    sections = {s["name"]: s for s in report["sections"]}
    failed = {name: (s["error"], [c for c in s["checks"] if not c["ok"]]) for name, s in sections.items()
              if s["status"] == "fail"}
    assert code == 0 and not failed, failed
    assert report["finished"] and list(sections) == list(gpu_check.SECTIONS)
    for name, section in sections.items():
        assert section["status"] in ("pass", "skipped"), (name, section["status"], section["reason"])
        if section["status"] == "skipped":
            assert section["reason"], name
    assert {n for n, s in sections.items() if s["status"] == "skipped"} == {"syncs", "memory"}  # CUDA only
    assert list(sections)[:2] == ["env", "recipe"] and sections["recipe"]["status"] == "pass"  # the recipe first
    recipe = sections["recipe"]["numbers"]
    assert recipe["steps"] == 4 and recipe["recipe"].startswith("the recipe for dcgan")  # the CPU row at 64 px
    assert recipe["skipped updates"] == {"skipped/D": 0, "skipped/G": 0}
    assert all((out / f"recipe_64px{end}").is_file() for end in (".png", "_plot.png", "_metrics.jsonl", ".log"))
    for name in CORRECTNESS:
        checks = sections[name]["checks"]
        assert checks and all(c["ok"] for c in checks), (name, checks)
    for finding in (f for s in sections.values() for f in s["findings"]):
        assert finding["name"] and finding["detail"]  # engine behaviour for the lead: reported, not asserted
    assert sections["engine_vs_plain"]["targets"] and "engine / plain (median)" in sections["engine_vs_plain"]["numbers"]
    quickstart = sections["quickstart"]["numbers"]
    assert quickstart["defaults"]["steps"] == 4 and quickstart["fast"]["batch"] == 32
    markdown = (out / gpu_check.REPORT_MD).read_text()
    assert all(f"## {name}:" in markdown for name in sections) and "| section | status |" in markdown
    assert time.monotonic() - start < report["options"]["deadline"]
    assert torch.get_num_threads() == 1  # the run put back the test process's thread count (conftest: 1)


def fake_run(tmp_path, deadline_s: float = 60.0) -> "gpu_check.Run":
    return gpu_check.Run(device=torch.device("cpu"), quick=True, out=tmp_path / "out", work=tmp_path / "work",
                         data_dir=str(tmp_path), deadline=time.monotonic() + deadline_s, fast_batch=256, fast_lr=None,
                         repeats=1)


def test_a_failing_section_never_stops_the_others_and_each_section_is_reported_as_it_ends(tmp_path, monkeypatch):
    written: list[list[str]] = []

    def passing(run, s, report):
        s.check("holds", True)
        s.number("summary", "fine")

    def raising(run, s, report):
        s.check("held before the error", True)
        raise RuntimeError("the first line of the error\nand a second line")

    def failing_check(run, s, report):
        s.check("does not hold", False, "why")

    def skipping(run, s, report):
        raise gpu_check.Skip("needs CUDA")

    def too_slow(run, s, report):
        time.sleep(5)

    def after(run, s, report):
        s.check("still ran", True)

    spec = gpu_check.Spec
    sections = {"passing": spec("p", passing, (0, 0), (30, 30)), "raising": spec("r", raising, (0, 0), (30, 30)),
                "failing_check": spec("f", failing_check, (0, 0), (30, 30)), "skipping": spec("s", skipping, (0, 0), (30, 30)),
                "too_slow": spec("t", too_slow, (0, 0), (1, 1)), "after": spec("a", after, (0, 0), (30, 30)),
                "needs_an_hour": spec("h", after, (3600, 3600), (4000, 4000))}
    monkeypatch.setattr(gpu_check, "SECTIONS", sections)
    report = gpu_check.Report(tmp_path / "out", {"device": "cpu"})
    original = report.write
    monkeypatch.setattr(report, "write", lambda: (original(), written.append(
        [s["status"] for s in json.loads((tmp_path / "out" / gpu_check.REPORT_JSON).read_text())["sections"]])))
    gpu_check.run_sections(fake_run(tmp_path), list(sections), report)
    status = {s.name: s for s in report.sections}
    assert {name: s.status for name, s in status.items()} == {
        "passing": "pass", "raising": "fail", "failing_check": "fail", "skipping": "skipped", "too_slow": "fail",
        "after": "pass", "needs_an_hour": "not run"}
    assert status["raising"].error == "RuntimeError: the first line of the error"
    assert "RuntimeError" in status["raising"].traceback and status["raising"].checks[0]["ok"]
    assert status["too_slow"].error.startswith("SectionTimeout: passed its time budget of 1 s")
    assert status["too_slow"].seconds < 3
    assert status["skipping"].reason == "needs CUDA" and status["needs_an_hour"].reason.startswith("out of time")
    assert len(written) == len(sections)  # the report was rewritten after every section
    assert written[0] == ["pass"] and written[-1][-1] == "not run"
    markdown = (tmp_path / "out" / gpu_check.REPORT_MD).read_text()
    assert "- [ ] does not hold: why  **FAILED**" in markdown and "Error: `RuntimeError: the first line" in markdown


def test_the_recipe_section_fails_on_a_non_finite_loss_and_on_a_skipped_update_storm(tmp_path):
    """The recipe run's metrics, written by hand: a NaN loss and 3 skipped D updates in 20 steps (15%) fail."""
    run_dir, report = tmp_path / "run", gpu_check.Report(tmp_path / "out", {})
    run_dir.mkdir()
    report.write()  # as main() does before any section
    rows = [{"step": 10, "loss/D": 0.7, "images/s": 100.0, "skipped/D": 0, "skipped/G": 0},
            {"step": 20, "loss/D": float("nan"), "images/s": 120.0, "skipped/D": 3, "skipped/G": 2}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = gpu_check.Section("recipe", "recipe")
    log = ("gan_accel: r3gan G and D (width 64, z 512) at 64 px\n"
           "gan_accel: stopped at the time limit (2 min) at step 23 of 20,000.")
    commands._recipe_numbers(s, run_dir, log, report)
    assert {c["name"] for c in s.failed_checks} == {"every logged loss is finite", "skipped updates <= 10% of steps"}
    assert s.numbers["steps"] == 23 and s.numbers["images/s (median)"] == 120.0  # the first row is warm-up
    assert s.numbers["recipe"] == "not printed" and s.numbers["grid"] == "none written"
    assert (tmp_path / "out" / "recipe_64px_metrics.jsonl").read_text() == (run_dir / "metrics.jsonl").read_text()


def test_the_sync_counter_separates_clean_steps_from_log_rows_and_names_the_lines():
    """The CUDA-only sync count, fed warnings by hand: a step's interval is busy when the step before it
    wrote a log row (its row is read after its on_step_end, so it lands in the next interval)."""
    records: list = []
    counter = speed.SyncCounter(records, skip=0)
    trainer = SimpleNamespace(step=0, config=SimpleNamespace(log_every=2, sample_every=100, checkpoint_every=100))

    def interval(syncs: int, step: int) -> None:
        records.extend(SimpleNamespace(message="called a synchronizing CUDA operation", filename="/x/data.py", lineno=7)
                       for _ in range(syncs))
        records.append(SimpleNamespace(message="an unrelated warning", filename="/x/other.py", lineno=1))
        trainer.step = step
        counter.on_step_end(trainer)

    for step, syncs in enumerate([1, 1, 4, 0, 3, 1], start=1):  # log rows at steps 2 and 4: steps 3 and 5 are busy
        interval(syncs, step)
    assert counter.clean == [1, 1, 0, 1] and counter.busy == [4, 3]
    assert counter.sites_clean == {"data.py:7": 3}


def test_the_fp16_accelerator_on_cpu_runs_the_engines_fp16_paths(tmp_path):
    """On CPU Accelerate turns fp16 off; the check's accelerator turns autocast and a GradScaler back on, and
    the engine then takes its fp16 paths (the scaler's skip mode, Accelerate's wrappers kept)."""
    run = fake_run(tmp_path)
    G, D = fixtures.tiny_models(torch.float32)
    trainer = fixtures.make_trainer(run, "fp16", G, D, fixtures.loader(fixtures.tiny_images(32, torch.float32), 4),
                                    mixed_precision="fp16", max_steps=2, accelerator=fixtures.fp16_accelerator(run, 64.0))
    assert trainer.accelerator.scaler.get_scale() == 64.0 and trainer.accelerator.native_amp
    from accelerate.optimizer import AcceleratedOptimizer

    assert isinstance(trainer.runner._steppers["D"], AcceleratedOptimizer)  # kept under fp16
    conv_dtypes = []
    trainer.accelerator.unwrap_model(trainer.D).net[1].register_forward_hook(lambda m, i, o: conv_dtypes.append(o.dtype))
    trainer.fit()
    assert trainer.runner.skippable.modes_used == {"scaler": 4}
    assert conv_dtypes and all(d == torch.float16 for d in conv_dtypes)


class CudaShapedRun(gpu_check.Run):
    """A Run that takes the CUDA branches while everything stays on the CPU (torch.cuda faked by the test)."""

    @property
    def cuda(self) -> bool:
        return True


def test_the_cuda_only_sections_run_their_python_on_cpu_with_torch_cuda_faked(tmp_path, monkeypatch):
    """syncs, memory and engine_vs_plain only run on CUDA: with torch.cuda's sync-debug, synchronize and memory
    calls faked and a tiny case, their code runs end to end here (what a GPU run would otherwise find first)."""
    peak = iter(range(100, 10**6, 100))
    fakes = {"set_sync_debug_mode": lambda mode: None, "synchronize": lambda *a: None, "empty_cache": lambda: None,
             "memory_allocated": lambda *a: 0, "reset_peak_memory_stats": lambda *a: None,
             "max_memory_allocated": lambda *a: next(peak) * 2**20, "is_bf16_supported": lambda *a, **k: True}
    for name, fake in fakes.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")  # the networks stay on the CPU even where a GPU is present
    tiny = dict(image=32, width=4, channels=3, batch=8, precision="no", block=2, blocks=2, warmup=1, n=64)
    monkeypatch.setattr(speed, "_speed_case", lambda run: dict(tiny))
    run = CudaShapedRun(**vars(fake_run(tmp_path)))
    report = gpu_check.Report(tmp_path / "out", {"device": "cuda"})
    gpu_check.run_sections(run, ["syncs", "engine_vs_plain", "memory"], report)
    sections = {s.name: s for s in report.sections}
    assert {n: (s.status, s.error) for n, s in sections.items()} == {n: ("pass", "") for n in sections}
    syncs = sections["syncs"].numbers
    assert syncs["plain loop: syncs per step"] == 0  # nothing warns here: the counting ran, on nothing
    assert sections["memory"].numbers["engine peak, MiB"] > 0
    assert sections["engine_vs_plain"].targets[0]["name"] == "engine / plain images/s"
