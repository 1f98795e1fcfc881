"""The Python examples of the README and of every docs page are real code: each page's blocks run, in order,
as written, and do what the page says they do.

Pages run in reading order (the README, then mkdocs.yml's nav), each in a scratch folder and a namespace of its
own, as a reader who opens that page would run it: a block may use what an earlier block of the same page
defined. Every page with Python blocks has a check below of what its blocks say they do; a new page with Python
blocks needs one. A page whose Python loads what its shell commands made (docs/own-images.md loads the folder
``gan-accel export`` wrote) gets it made first, at small settings, by its entry in SETUPS.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from doc_pages import blocks, page_name, pages


def rows(metrics: Path) -> list[dict]:
    """The rows of a metrics.jsonl file."""
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def check_readme(runs: Path, namespace: dict) -> None:
    # the API in ten lines
    assert (runs / "readme" / "samples_final.png").exists() and (runs / "readme" / "metrics.jsonl").exists()
    # your own modules: the callback's file, the lazy R1 phase, the GANLoss of its own
    assert [line.split()[0] for line in (runs / "readme_own" / "losses.txt").read_text().splitlines()] == ["10", "20"]
    assert "loss/R1" in rows(runs / "readme_own" / "metrics.jsonl")[-1]
    assert json.loads((runs / "readme_own" / "config.json").read_text())["loss"] == "ls"


def setup_own_images(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the page's shell commands make before its Python blocks: a conditional run on class folders 0-9, exported
    as ``photos_gan`` (20 images, 1 step: the blocks load, sample, save and push it, the shell test runs the page's
    commands); the Hub is a local stand-in (tests/hub_stand_in.py) under ``hub/``."""
    from hub_stand_in import StandInHub

    StandInHub.installed(scratch / "hub", monkeypatch)
    import numpy as np
    from PIL import Image

    from conftest import reset_accelerate_state
    from gan_accel.cli import main

    rng = np.random.default_rng(0)
    for index in range(20):
        folder = scratch / "photos" / str(index % 10)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    reset_accelerate_state()
    assert main(["train", "--data", "photos", "--conditional", "--output-dir", "runs/photos_cond", "--steps", "1",
                 "--batch-size", "8", "--width", "4", "--no-progress", "--cache-dir", str(scratch / "cache")]) == 0
    assert main(["export", "runs/photos_cond", "photos_gan"]) == 0


def check_own_images(runs: Path, namespace: dict) -> None:
    assert namespace["G"].class_names == [str(digit) for digit in range(10)]
    assert namespace["sevens"].shape == (16, 3, 32, 32) and namespace["sevens"].abs().max() <= 1
    # save_pretrained, push_to_hub and from_pretrained: the export's files, and the same G back from the Hub
    files = ["README.md", "config.json", "model.safetensors", "samples.png"]
    saved, pushed = runs.parent / "photos_gan_saved", runs.parent / "hub" / "your-name" / "photos-gan"
    assert sorted(p.name for p in saved.iterdir()) == files == sorted(p.name for p in pushed.iterdir())
    assert "license: apache-2.0" in (saved / "README.md").read_text()
    assert "load_generator('your-name/photos-gan')" in (pushed / "README.md").read_text()
    G, back = namespace["G"], namespace["G_hub"]
    assert all(torch.equal(value, back.state_dict()[key]) for key, value in G.state_dict().items())


def check_models_and_augmentation(runs: Path, namespace: dict) -> None:
    assert tuple(namespace["images"].shape) == (4, 3, 128, 128) and tuple(namespace["logits"].shape) == (4,)
    assert namespace["spec"]["family"] == "resnet" and namespace["spec"]["width"] == 16
    assert namespace["config"].augment == "ada" and namespace["config"].ada_interval == 4
    rows = [json.loads(line) for line in (runs / "steered" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "augment/overfit" in row] == [25, 50]


def check_api(runs: Path, namespace: dict) -> None:
    assert (runs / "api" / "samples_final.png").exists()
    assert namespace["samples"].shape == (16, 1, 28, 28)
    # settle: the flag given, the recipe's row beside it, and a resume that keeps the run's own
    run, again = namespace["run"], namespace["again"]
    assert (run.config.lr_G, run.config.lr_D, run.sources["lr_g"], run.sources["lr_d"]) == (1e-3, 3e-3, "flag", "recipe")
    assert again.config.lr_G == 1e-3 and again.sources["lr_g"] == "resume" and again.config.max_steps == 80
    # the phase example: its extra phases ran and were logged
    assert {"loss/D", "loss/R1", "loss/G", "loss/brightness"} <= set(rows(runs / "api_phases" / "metrics.jsonl")[-1])


def check_config(runs: Path, namespace: dict) -> None:
    messages = namespace["messages"]
    assert messages[0] == "lr_G=0.0 is invalid: expected a finite number > 0"
    assert messages[1] == "mixed_precision='fp8' is invalid: choose one of no, bf16, fp16"
    assert len(messages) == 3 and "'tensorbord' is not a tracker" in messages[2]
    config = namespace["config"]  # the Ramps' section
    assert config.lr_G(namespace["halfway"]) == 1.25e-4 and config.augment_p(namespace["halfway"]) == 0.6


def check_callbacks(runs: Path, namespace: dict) -> None:
    gaps = json.loads((runs / "callback" / "logit_gap.json").read_text())
    assert [step for step, _ in gaps] == [5, 10, 15, 20]
    # control.log: each gap lands in the row after the one it was computed from
    logged = rows(runs / "callback" / "metrics.jsonl")
    assert [row.get("gap") for row in logged] == [None] + [gap for _, gap in gaps[:-1]]


def check_conditional(runs: Path, namespace: dict) -> None:
    # one grid row per class, samples of the class asked for
    assert namespace["threes"].shape == (8, 1, 28, 28)
    from gan_accel.storage.run_folder import read_fixed_latents

    fixed_labels = read_fixed_latents(runs / "conditional")[1]
    assert torch.equal(fixed_labels, torch.arange(10).repeat_interleave(10))


def check_custom_modules(runs: Path, namespace: dict) -> None:
    # 2-D points give scatter plots (not tensors), trained with the loss of its own
    assert (runs / "circle" / "samples_000050.png").exists() and not list((runs / "circle").glob("samples_*.pt"))
    assert json.loads((runs / "circle" / "config.json").read_text())["loss"] == "least_squares_01"
    assert rows(runs / "circle" / "metrics.jsonl")[-1]["step"] == 100


def check_resume(runs: Path, namespace: dict) -> None:
    assert namespace["metrics"]["step"] == 20 and namespace["trainer"].step == 20
    history = [json.loads(line)["event"] for line in (runs / "resumable" / "history.jsonl").read_text().splitlines()]
    assert history == ["start", "resume"]
    assert [row["step"] for row in rows(runs / "resumable" / "metrics.jsonl")] == [20]  # log_every 50: the last step


def check_evaluation(runs: Path, namespace: dict) -> None:
    # scores logged, the best checkpoint named and kept
    best = json.loads((runs / "eval" / "best.json").read_text())
    assert (runs / "eval" / best["checkpoint"]).is_dir()
    assert "eval/fd" in rows(runs / "eval" / "metrics.jsonl")[-1] and "eval/fd" in namespace["metrics"]
    # precision and recall measured in VGG-16 features, under names that say so; where the weights go
    assert {"precision_vgg16-fc2", "recall_vgg16-fc2", "fd", "kid"} <= set(namespace["scores"])
    assert namespace["WEIGHTS"].cache_path.name == "vgg16-397923af.pth"


def check_health_and_trackers(runs: Path, namespace: dict) -> None:
    assert (runs / "watched" / "training_plot.png").exists() and (runs.parent / "late_steps.png").exists()
    # D's probe with the held-out images
    held = [row for row in rows(runs / "held_out" / "metrics.jsonl") if "health/d_spread" in row]
    assert [row["step"] for row in held] == [10, 20] and all("health/d_heldout" in row for row in held)
    assert list((runs / "tracked" / "trackers" / "tracked").glob("events.out.tfevents.*"))


def check_security(runs: Path, namespace: dict) -> None:
    # the safe tree's round trip, as the page shows it
    assert namespace["back"]["step"] == 3 and torch.equal(namespace["back"]["ema"]["w"], namespace["tree"]["ema"]["w"])


CHECKS = {
    "README.md": check_readme,
    "docs/own-images.md": check_own_images,
    "docs/models-and-augmentation.md": check_models_and_augmentation,
    "docs/api.md": check_api,
    "docs/config.md": check_config,
    "docs/callbacks.md": check_callbacks,
    "docs/conditional.md": check_conditional,
    "docs/custom-modules.md": check_custom_modules,
    "docs/resume.md": check_resume,
    "docs/evaluation.md": check_evaluation,
    "docs/health-and-trackers.md": check_health_and_trackers,
    "docs/security.md": check_security,
}


SETUPS = {"docs/own-images.md": setup_own_images}


def pages_with_python() -> list[Path]:
    return [page for page in pages() if blocks(page, "python")]


def test_every_page_with_python_blocks_has_a_check_of_what_they_do():
    assert [page_name(page) for page in pages_with_python()] == list(CHECKS), (
        "CHECKS must name the pages with ```python blocks, in reading order: add a check of what a new page's "
        "blocks say they do")
    assert len(blocks(pages()[0], "python")) >= 2, "the README holds the API in ten lines and the own-modules example"


@pytest.mark.parametrize("page", pages_with_python(), ids=page_name)
def test_python_blocks_run_and_do_what_they_say(page, tmp_path, monkeypatch):
    from conftest import reset_accelerate_state

    monkeypatch.chdir(tmp_path)
    if page_name(page) in SETUPS:
        SETUPS[page_name(page)](tmp_path, monkeypatch)
    namespace: dict = {}
    for number, block in enumerate(blocks(page, "python"), start=1):
        reset_accelerate_state()  # each block builds its own trainer, as a fresh script would
        exec(compile(block, f"{page_name(page)}, python block {number}", "exec"), namespace)
    CHECKS[page_name(page)](tmp_path / "runs", namespace)
