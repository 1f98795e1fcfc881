"""The README's Python examples are real code: run every block, in order, as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gan_accel.callbacks.metrics_log import read_metrics

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_blocks_run_and_do_what_they_say(tmp_path, monkeypatch):
    from conftest import reset_accelerate_state

    blocks = readme_python_blocks()
    assert len(blocks) >= 3, "the README must hold the API, phase and callback examples"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        reset_accelerate_state()  # each block builds its own trainer, as a fresh script would
        exec(compile(block, str(README), "exec"), namespace)
    runs = tmp_path / "runs"
    # the API example
    assert (runs / "readme" / "samples_final.png").exists() and (runs / "readme" / "metrics.jsonl").exists()
    # the phase example: its extra phases ran and were logged
    last = read_metrics(runs / "readme_phases" / "metrics.jsonl")[-1]
    assert {"loss/D", "loss/R1", "loss/G", "loss/brightness"} <= set(last)
    # the evaluation example: scores logged, the best checkpoint named and kept
    best = json.loads((runs / "readme_eval" / "best.json").read_text())
    assert (runs / "readme_eval" / best["checkpoint"]).is_dir()
    assert "eval/fd" in read_metrics(runs / "readme_eval" / "metrics.jsonl")[-1]
    # the callback example
    gaps = json.loads((runs / "readme_callback" / "logit_gap.json").read_text())
    assert [step for step, _ in gaps] == [5, 10, 15, 20]
