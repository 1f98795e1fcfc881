"""Weights as safetensors, and the one generator format: a folder of ``config.json`` + ``model.safetensors``.

A run ends by writing it as ``<run>/generator/``, ``gan-accel export`` adds a model card, ``load_generator``
reads it. ``config.json`` holds what rebuilds G (the networks' spec, class names, what the weights are) and the
run's config, data summary and scores, local paths cut to their last part.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import save
from torch import nn

from ..errors import CheckpointError, UnsafeFileError
from .files import atomic_path, first_line, make_own_folder, write_bytes_synced
from .finite import check_finite
from .reading import load_safetensors
from .layout import BEST, CLASS_NAMES, DATA_RECORD, EVAL, EXPORT_CONFIG, EXPORT_WEIGHTS, read_json

FORMAT = "gan_accel.generator"
FORMAT_VERSION = 1


def save_weights(module: nn.Module, path: str | os.PathLike) -> Path:
    """Write ``module``'s state dict atomically as safetensors, with the mode of any file the user creates (the
    umask's: 0644 as a rule; safetensors' own writer makes 0600, unreadable to others once copied or served)."""
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    write_bytes_synced(path, save(state, metadata={"format": "pt"}))
    return Path(path)


def state_dict_reason(error: BaseException) -> str:
    """Why ``load_state_dict`` refused (its first line is only ``Error(s) in loading state_dict for X:``): the first
    reason, a size mismatch before missing or unexpected keys, and how many more there are."""
    head, *rest = str(error).strip().splitlines() or [""]
    lines = [line.strip() for line in rest if line.strip()]
    if not head.startswith("Error(s) in loading state_dict") or not lines:
        return first_line(error)
    lines.sort(key=lambda line: not line.startswith("size mismatch"))  # the shape names the cause best
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return lines[0][:300] + more


def load_weights(module: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load a safetensors file (a run's ``generator/model.safetensors``, say) into ``module`` (strict), with a
    clear error on mismatch."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file at {path}: pass the generator/model.safetensors of a finished run")
    try:
        state = load_safetensors(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file (truncated or corrupt?): "
                              f"{first_line(error)}") from None
    check_finite(state, path)
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(
            f"{path} does not fit {type(module).__name__}: was it saved from a model of another shape or width? "
            f"{state_dict_reason(error)}"
        ) from error
    return module


def _read_optional(path: Path) -> Any:
    """A JSON file of the run, or None when it is missing or unreadable (writing G never fails for it)."""
    try:
        return read_json(path)
    except (OSError, ValueError, UnsafeFileError):  # a FIFO or a huge file there is no record either
        return None


def public_path(text: Any) -> Any:
    """A path on this machine cut to its last part (what an export records of local paths); other text as is."""
    if not isinstance(text, str) or not text:
        return text
    if text.startswith("imagefolder "):
        return "imagefolder " + public_path(text[len("imagefolder "):])
    looks_local = os.path.isabs(text) or text.startswith(("~", ".")) or ("/" in text and os.path.exists(text))
    return (Path(text).name or text) if looks_local else text


def scores_of(run: Path) -> dict[str, Any]:
    """The run's recorded evaluations (``best.json``, ``eval.json``), None where absent."""
    return {"best": _read_optional(run / BEST), "eval": _read_optional(run / EVAL)}


def generator_config(config: dict[str, Any], step: Any, ema: bool, has_ema: bool, run: Path) -> dict[str, Any]:
    """The ``config.json`` of the format (see the module docstring) for G of a run whose config is ``config``."""
    import gan_accel

    spec = config.get("model") if isinstance(config.get("model"), dict) else None
    training = dict(config)
    training["output_dir"] = public_path(str(training.get("output_dir", "")))
    extra = dict(training.get("extra") or {})
    if "data_source" in extra:
        extra["data_source"] = public_path(extra["data_source"])
    training["extra"] = extra
    data = _read_optional(run / DATA_RECORD)
    if isinstance(data, dict):
        data = {**data, "source": public_path(data.get("source"))}
    names = _read_optional(run / CLASS_NAMES)
    num_classes = spec.get("num_classes") if spec else None
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gan_accel_version": gan_accel.__version__,
        "model": spec,
        "class_names": [str(n) for n in names] if isinstance(names, list) and len(names) == num_classes else None,
        "weights": {"file": EXPORT_WEIGHTS, "ema": bool(ema), "has_ema": bool(has_ema), "step": step,
                    "dtype": "float32"},
        "latent": {"distribution": "standard normal", "shape": [spec.get("z_dim")]} if spec else None,
        "output": {"shape": [spec.get("channels"), spec.get("image_size"), spec.get("image_size")], "range": [-1, 1]}
        if spec else None,
        "training": training, "data": data if isinstance(data, dict) else None, "scores": scores_of(run),
    }


def save_generator(folder: Path, G: nn.Module, config: dict[str, Any]) -> None:
    """Write ``model.safetensors`` (G's weights) and then ``config.json`` into ``folder``, each file atomically."""
    make_own_folder(folder, "the generator")  # a link there would put G outside the run
    save_weights(G, folder / EXPORT_WEIGHTS)
    with atomic_path(folder / EXPORT_CONFIG) as tmp:
        tmp.write_text(json.dumps(config, indent=2, default=str) + "\n")
