"""The README's API example is real code: run it as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_api_example_runs_and_writes_its_outputs(tmp_path, monkeypatch):
    blocks = readme_python_blocks()
    assert blocks, "the README must hold a python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    metrics = namespace["metrics"]
    assert {"loss/D", "loss/G", "lr/D", "lr/G", "D(x)", "D(G(z))", "images/s"} <= set(metrics)
    run = tmp_path / "runs" / "readme"
    assert (run / "samples_final.png").exists() and (run / "metrics.jsonl").exists()
