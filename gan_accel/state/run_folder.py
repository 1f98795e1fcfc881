"""The run folder: refusing to mix two runs, clearing a replaced one, and the files that describe a run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..errors import PreflightError
from .checkpoint import checkpoint_root, list_checkpoints

RUN_FILES = ("config.json", "metrics.jsonl", "generator.safetensors")
GENERATED = ("samples_*.png", "samples_*.pt", "progress.gif", "fixed_noise.pt", "eval.json")


def check_output_dir(output_dir: str | os.PathLike, resuming: bool, overwrite: bool) -> None:
    """Refuse to mix a new run into a folder that holds another one (nothing saved is ever lost silently)."""
    path = Path(output_dir)
    if resuming or overwrite or not path.is_dir():
        return
    found = [name for name in RUN_FILES if (path / name).exists()]
    checkpoints = list_checkpoints(path)
    if found or checkpoints:
        held = ", ".join(found + ([f"{len(checkpoints)} checkpoint(s)"] if checkpoints else []))
        raise PreflightError(
            f"output folder {path} already holds a run ({held}): resume it (resume_from='latest', "
            "--resume latest), replace it explicitly (overwrite=True, --overwrite), or choose another output_dir"
        )


def clear_run_files(output_dir: str | os.PathLike) -> None:
    """Remove a previous run's gan_accel files (only with overwrite=True); other files are left alone."""
    path = Path(output_dir)
    if not path.is_dir():
        return
    for pattern in (*RUN_FILES, *GENERATED):
        for file in path.glob(pattern):
            file.unlink()
    shutil.rmtree(checkpoint_root(path), ignore_errors=True)


def write_run_description(output_dir: str | os.PathLike, config: Any, fixed_latents: Any) -> None:
    """``config.json`` and ``fixed_noise.pt`` (the fixed latents, identical on every process)."""
    path = Path(output_dir)
    path.mkdir(parents=True, exist_ok=True)
    config.to_json(path / "config.json")
    torch.save(fixed_latents, path / "fixed_noise.pt")
