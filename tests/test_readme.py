"""The README's Python examples are real code: run every block, in order, as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gan_accel.callbacks.metrics_log import read_metrics

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


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
    # the conditional example: one grid row per class, samples of the class asked for
    import torch

    assert namespace["threes"].shape == (8, 1, 28, 28)
    from gan_accel.state.run_folder import read_fixed_latents

    fixed_labels = read_fixed_latents(runs / "readme_conditional")[1]
    assert torch.equal(fixed_labels, torch.arange(10).repeat_interleave(10))
    # the GANLoss example trained with the loss of its own
    saved = json.loads((runs / "readme_loss" / "config.json").read_text())
    assert saved["loss"] == "my_loss" and read_metrics(runs / "readme_loss" / "metrics.jsonl")[-1]["step"] == 5


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_links_point_at_its_headings_and_every_block_says_its_language():
    text = README.read_text()
    outside_code = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    anchors = [heading_anchor(h) for h in re.findall(r"(?m)^#{1,6} (.+)$", outside_code)]
    assert len(anchors) == len(set(anchors)), "two headings share an anchor: links to the second would miss"
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links, "the table of contents links to the sections"
    assert not set(links) - set(anchors), f"links to no heading: {sorted(set(links) - set(anchors))}"
    # python blocks run (above), bash blocks run (test_readme_shell.py), text blocks are output and listings
    fences = re.findall(r"(?m)^```(.*)$", text)[::2]
    assert set(fences) <= {"python", "bash", "text"}, f"code blocks must say python, bash or text: {fences}"
