"""Weights in and out as safetensors, with the run's config in the file's metadata."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import CheckpointError
from .files import atomic_path
from .safe_tree import check_regular_file


def save_weights(module: nn.Module, path: str | os.PathLike, metadata: dict[str, Any] | None = None) -> Path:
    """Write ``module``'s state dict atomically; ``metadata`` (JSON-able) travels inside the file."""
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={"gan_accel": json.dumps(metadata or {})})
    return Path(path)


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The metadata dict stored by :func:`save_weights` (empty for foreign files)."""
    from safetensors import safe_open

    check_regular_file(Path(path))
    try:
        with safe_open(str(path), framework="pt") as handle:
            text = (handle.metadata() or {}).get("gan_accel", "{}")
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file (truncated or corrupt?): "
                              f"{_first_line(error)}") from None
    try:
        metadata = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{path}: its gan_accel metadata is not valid JSON ({_first_line(error)}): the file was "
                              "changed or damaged") from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("config", {}), dict):
        raise CheckpointError(f"{path}: its gan_accel metadata is not an object of the form gan_accel "
                              "writes (a JSON object with a config object): the file was changed or damaged")
    return metadata


def load_weights(module: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load weights saved by :func:`save_weights` into ``module`` (strict), with a clear error on mismatch."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file at {path}: pass the generator.safetensors of a finished run")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file (truncated or corrupt?): "
                              f"{_first_line(error)}") from None
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(
            f"{path} does not fit {type(module).__name__}: was it saved from a model of another shape or width? "
            f"{str(error).splitlines()[0]}"
        ) from error
    return module


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
