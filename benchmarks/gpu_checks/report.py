"""The GPU check's report: each section's result (checks, findings, targets, numbers, notes) and the
JSON and Markdown files, rewritten after every section so that a killed run still leaves a report."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

REPORT_JSON, REPORT_MD = "gpu_check.json", "gpu_check.md"
NOT_COVERED = [
    "DDP with BatchNorm and broadcast_buffers=False, and the asynchronous stop flag: they need 2 processes "
    "with a GPU each (NCCL refuses two ranks on one GPU); run tests/test_distributed.py's scenarios under "
    "`accelerate launch --multi_gpu --num_processes 2` on a 2-GPU machine",
]


class Skip(Exception):
    """A section that cannot run here, with the reason."""


class SectionTimeout(Exception):
    """A section ran past its time budget."""


@dataclass
class Section:
    """One section's result, filled in while it runs."""

    name: str
    title: str
    status: str = "not run"  # pass, fail, skipped, not run
    reason: str = ""
    seconds: float = 0.0
    checks: list[dict] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""
    traceback: str = ""

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record a check that must hold; returns ``ok``."""
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        return bool(ok)

    def finding(self, name: str, detail: str) -> None:
        """Record engine behaviour that differs from its documentation: for the lead, not a failure here."""
        self.findings.append({"name": name, "detail": detail})

    def target(self, name: str, value: float, minimum: float, detail: str = "") -> None:
        self.targets.append({"name": name, "value": value, "minimum": minimum, "met": value >= minimum,
                             "detail": detail})

    def number(self, key: str, value: Any) -> None:
        self.numbers[key] = value

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def failed_checks(self) -> list[dict]:
        return [c for c in self.checks if not c["ok"]]


class Report:
    """The JSON and Markdown report, rewritten after every section."""

    def __init__(self, out: Path, options: dict) -> None:
        self.out = out
        self.options = options
        self.environment: dict[str, Any] = {}
        self.sections: list[Section] = []
        self.started = time.time()
        self.finished = False

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"options": self.options, "environment": self.environment, "started": _stamp(self.started),
                "elapsed_s": round(time.time() - self.started, 1), "finished": self.finished,
                "not_covered": NOT_COVERED, "sections": [vars(s) for s in self.sections]}
        _atomic_write(self.out / REPORT_JSON, json.dumps(data, indent=2, default=_jsonable) + "\n")
        _atomic_write(self.out / REPORT_MD, self.markdown())

    def markdown(self) -> str:
        env = self.environment
        lines = ["# gan_accel GPU check", "",
                 f"{env.get('device_name', '?')} ({self.options.get('device')}{', quick' if self.options.get('quick') else ''}); "
                 f"torch {env.get('torch', '?')}, accelerate {env.get('accelerate', '?')}, CUDA {env.get('cuda', '-')}; "
                 f"started {_stamp(self.started)}, {time.time() - self.started:.0f} s"
                 f"{'' if self.finished else ' so far (the run did not finish)'}", "",
                 "| section | status | time, s | checks | findings | targets | summary |",
                 "| --- | --- | ---: | ---: | ---: | --- | --- |"]
        for s in self.sections:
            checks = f"{len(s.checks) - len(s.failed_checks)}/{len(s.checks)}" if s.checks else "-"
            targets = ", ".join("met" if t["met"] else "NOT met" for t in s.targets) or "-"
            short = s.reason.split(": ")[0].split(" (")[0]  # the whole reason is in the section below
            status = s.status + (f": {short}" if s.reason and s.status in ("skipped", "not run") else "")
            lines.append(f"| {s.name} | {status} | {s.seconds:.1f} | {checks} | {len(s.findings) or '-'} | {targets} | "
                         f"{_md_cell(s.numbers.get('summary', s.error))} |")
        lines += ["", "Not covered by a one-GPU run: " + " ".join(NOT_COVERED), ""]
        for s in self.sections:
            lines += [f"## {s.name}: {s.title}", "", f"**{s.status}**" + (f": {s.reason}" if s.reason else "")
                      + f" ({s.seconds:.1f} s)", ""]
            if s.error:
                lines += [f"Error: `{s.error}`", ""]
            for c in s.checks:
                lines.append(f"- [{'x' if c['ok'] else ' '}] {c['name']}" + (f": {c['detail']}" if c["detail"] else "")
                             + ("" if c["ok"] else "  **FAILED**"))
            for f_ in s.findings:
                lines.append(f"- [!] finding: {f_['name']}: {f_['detail']}")
            for t in s.targets:
                lines.append(f"- target {t['name']}: {t['value']:.3f} against >= {t['minimum']} "
                             f"({'met' if t['met'] else 'NOT met'}){': ' + t['detail'] if t['detail'] else ''}")
            if s.checks or s.findings or s.targets:
                lines.append("")
            numbers = {k: v for k, v in s.numbers.items() if k != "summary"}
            if numbers:
                lines += ["| number | value |", "| --- | --- |"]
                lines += [f"| {_md_cell(k)} | {_md_cell(_fmt(v))} |" for k, v in numbers.items()]
                lines.append("")
            lines += [f"- {n}" for n in s.notes]
            if s.notes:
                lines.append("")
        return "\n".join(lines) + "\n"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=_jsonable)
    return str(value)


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return repr(value)


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
