"""A module's weights in and out as safetensors: for generators of your own classes (gan_accel's own networks
load with :func:`gan_accel.load_generator`)."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import CheckpointError
from .files import atomic_path


def save_weights(module: nn.Module, path: str | os.PathLike) -> Path:
    """Write ``module``'s state dict atomically as safetensors."""
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp))
    return Path(path)


def load_weights(module: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load a safetensors file (a run's ``generator/model.safetensors``, say) into ``module`` (strict), with a
    clear error on mismatch."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file at {path}: pass the generator/model.safetensors of a finished run")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        text = str(error).strip()
        raise CheckpointError(f"{path} is not a readable safetensors file (truncated or corrupt?): "
                              f"{text.splitlines()[0][:300] if text else type(error).__name__}") from None
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(
            f"{path} does not fit {type(module).__name__}: was it saved from a model of another shape or width? "
            f"{str(error).splitlines()[0]}"
        ) from error
    return module
