"""Sampling from a finished run or a checkpoint, without the trainer: what ``gan-accel sample`` uses.

    G, info = load_generator("runs/conditional_mnist")                  # generator.safetensors
    G, info = load_generator("runs/conditional_mnist/checkpoints/checkpoint_00002000")
    images, labels = sample_images(G, info, num=100, label=3)           # 100 threes

The generator is rebuilt from the networks' spec the run recorded in ``config.model`` (runs written
before that field existed kept it in ``config.extra.model``); a run of your own modules loads with :func:`gan_accel.state.load_weights`
into your class. From a checkpoint the EMA's weights are used when the run kept an EMA, as the run
itself samples; ``ema=False`` gives the raw G instead.

Where the raw G of a run with an EMA lives: ``generator.safetensors`` holds the EMA only (the
sampling generator), and every checkpoint holds both (the raw G as Accelerate's ``model.safetensors``,
the EMA in the engine state). A run writes a checkpoint at its last step, so ``ema=False`` on a
finished run folder loads the raw G from ``checkpoints/checkpoint_<step of the export>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import upgrade_config_dict
from .errors import CheckpointError, ConfigError
from .models import build_generator
from .state.checkpoint import engine_state_file, is_complete, list_checkpoints, read_engine_state, read_marker
from .state.layout import CHECKPOINTS, ENGINE_STATE, GENERATOR, RAW_GENERATOR, checkpoint_name
from .state.weights import load_weights, read_metadata

EMA_STATE_NAMES = ("generator_ema", "ema")  # the EMA callback's state in a checkpoint: its name now, and before


def load_generator(path: str | os.PathLike, ema: bool = True) -> tuple[nn.Module, dict[str, Any]]:
    """A run folder's ``generator.safetensors``, or a checkpoint folder's G; returns (G in eval mode, info).

    ``ema=False``: the raw G rather than its EMA (see the module docstring for where it is found).
    ``info`` holds ``config`` (the run's config dict), ``step``, ``conditional``, ``num_classes``,
    ``ema`` (whether the weights loaded are the EMA), ``has_ema`` (whether the run kept one) and
    ``weights`` (the file they came from).
    """
    path = Path(path)
    if is_complete(path):
        return _from_checkpoint(path, ema)
    weights = path / GENERATOR
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found: is {path} a finished gan_accel run folder (the weights are "
                              "written at the end of a run), or pass one of its checkpoints/checkpoint_<step> folders")
    metadata = read_metadata(weights)
    config = upgrade_config_dict(metadata.get("config") if isinstance(metadata.get("config"), dict) else {})
    exported_ema = metadata.get("ema", _config_has_ema(config))
    if exported_ema and not ema:
        return _raw_of_export(path, metadata.get("step"))
    G = load_weights(_build(config, weights), weights)
    return G.eval(), _info(config, metadata.get("step"), ema=bool(exported_ema), has_ema=bool(exported_ema),
                           weights=weights)


def _raw_of_export(run: Path, step: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The raw G of a finished run whose export is the EMA: from the checkpoint of the export's step."""
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise CheckpointError(f"{run}/{GENERATOR} records step {str(step)[:40]!r}, which is not a step: the file was "
                              "changed or damaged; pass one of the run's checkpoint folders instead")
    checkpoint = run / CHECKPOINTS / checkpoint_name(int(step or 0))
    if not is_complete(checkpoint):
        found = [p.name for p in list_checkpoints(run)]
        raise CheckpointError(
            f"{run}/{GENERATOR} holds the EMA of G only, and the raw G of step {step} is kept in "
            f"{checkpoint}, which is gone: pass a checkpoint folder to sample its raw G "
            f"(complete ones: {', '.join(found) or 'none'}), or leave out --no-ema / ema=False")
    return _from_checkpoint(checkpoint, ema=False)


def _from_checkpoint(path: Path, ema: bool = True) -> tuple[nn.Module, dict[str, Any]]:
    state_file = engine_state_file(path, 0)
    if state_file is None:
        raise CheckpointError(f"checkpoint {path} has no {ENGINE_STATE.format(rank=0)} (the engine state, with the EMA "
                              "and the config): it was copied in part or damaged; pass another checkpoint of the run")
    state = read_engine_state(path, 0)  # safe formats only: nothing in it can run code
    marker_config = read_marker(path).get("config")
    config = upgrade_config_dict(marker_config if isinstance(marker_config, dict) and marker_config else state["config"])
    G = _build(config, path)
    callbacks = state["callbacks"]
    average = next((callbacks[name] for name in EMA_STATE_NAMES if name in callbacks), None)
    has_ema = isinstance(average, dict)
    if has_ema and ema:  # the run samples from the EMA of G: so does this
        _load_average(G, average, state_file)
        source = state_file
    else:
        source = path / RAW_GENERATOR
        if not source.is_file():
            raise CheckpointError(f"checkpoint {path} holds no weights of G ({RAW_GENERATOR} is missing): it was copied in "
                                  "part or damaged; pass another checkpoint of the run")
        load_weights(G, source)
    return G.eval(), _info(config, state["step"], ema=has_ema and ema, has_ema=has_ema, weights=source)


def _load_average(G: nn.Module, average: dict[str, Any], state_file: Path) -> None:
    weights = average.get("module")
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{state_file} holds no EMA weights of G (its EMA state has no tensors under 'module'): "
                              "the checkpoint was damaged; pass another checkpoint, or --no-ema / ema=False")
    try:
        G.load_state_dict(weights)
    except RuntimeError as error:
        raise CheckpointError(f"the EMA weights in {state_file} do not fit the generator its config describes: "
                              f"{str(error).strip().splitlines()[0]}") from None


def _config_has_ema(config: dict[str, Any]) -> bool:
    return config.get("ema_decay") is not None or config.get("ema_half_life") is not None


def _build(config: dict[str, Any], source: Path) -> nn.Module:
    """G from the run's recorded spec (:func:`gan_accel.models.build_generator`)."""
    spec = config.get("model")
    if not isinstance(spec, dict):
        raise CheckpointError(f"{source} records no model spec (config.model): load the weights with "
                              "gan_accel.state.load_weights into your own generator class")
    try:
        return build_generator(spec)
    except ConfigError as error:
        raise CheckpointError(f"{source} records a model spec gan_accel cannot rebuild ({error}): load the weights "
                              "with gan_accel.state.load_weights into your own generator class") from None


def _info(config: dict[str, Any], step: Any, ema: bool, has_ema: bool, weights: Path) -> dict[str, Any]:
    num_classes = config.get("num_classes")
    return {"config": config, "step": step, "conditional": num_classes is not None, "num_classes": num_classes,
            "ema": ema, "has_ema": has_ema, "weights": str(weights)}


@torch.no_grad()
def sample_images(G: nn.Module, info: dict[str, Any], num: int, label: int | None = None,
                  seed: int = 0, batch_size: int = 500) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``num`` samples (N, C, H, W) in [-1, 1] and their labels (None for an unconditional G).

    A conditional G gives ``num`` samples of ``label``, or without one ``num // num_classes`` of
    each class, class by class. Raises :class:`ConfigError` for a label the run cannot take. The
    latents are drawn at once from ``seed``; G runs on ``batch_size`` of them at a time (in eval
    mode each sample's image depends on its latent and label only).
    """
    num_classes = info["num_classes"]
    if label is not None and not info["conditional"]:
        raise ConfigError("this run is unconditional (no num_classes): it cannot sample a chosen class; "
                         "leave out the label")
    if label is not None and not 0 <= label < num_classes:
        raise ConfigError(f"label {label} is outside the run's classes 0..{num_classes - 1}")
    generator = torch.Generator().manual_seed(seed)
    if not info["conditional"]:
        z = torch.randn(num, G.z_dim, generator=generator)
        return torch.cat([G(part) for part in z.split(batch_size)]), None
    if label is not None:
        labels = torch.full((num,), label, dtype=torch.long)
    else:
        labels = torch.arange(num_classes).repeat_interleave(max(1, num // num_classes))
    z = torch.randn(len(labels), G.z_dim, generator=generator)
    return torch.cat([G(zs, ys) for zs, ys in zip(z.split(batch_size), labels.split(batch_size))]), labels
