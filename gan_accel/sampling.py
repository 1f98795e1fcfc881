"""Sampling from a finished run or a checkpoint, without the trainer: what ``gan-accel sample`` uses.

    G, info = load_generator("runs/conditional_mnist")                  # generator.safetensors
    G, info = load_generator("runs/conditional_mnist/checkpoints/checkpoint_00002000")
    images, labels = sample_images(G, info, num=100, label=3)           # 100 threes

The generator is rebuilt from the model sizes the example scripts record in ``config.extra.model``
(DCGAN or conditional DCGAN); a run of your own modules loads with :func:`gan_accel.state.load_weights`
into your class. From a checkpoint the EMA's weights are used when the run kept an EMA, as the run
itself samples.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import CheckpointError, ConfigError
from .models import ConditionalDCGANGenerator, DCGANGenerator
from .state.checkpoint import ENGINE_STATE, is_complete, read_marker
from .state.weights import load_weights, read_metadata

MODEL_KEYS = {"z_dim", "width", "image_size", "channels"}


def load_generator(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """A run folder's ``generator.safetensors``, or a checkpoint folder's G; returns (G in eval mode, info).

    ``info`` holds ``config`` (the run's config dict), ``step``, ``conditional`` and ``num_classes``.
    """
    path = Path(path)
    if is_complete(path):
        return _from_checkpoint(path)
    weights = path / "generator.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found: is {path} a finished gan_accel run folder (the weights are "
                              "written at the end of a run), or pass one of its checkpoints/checkpoint_<step> folders")
    metadata = read_metadata(weights)
    config = metadata.get("config", {})
    G = load_weights(_build(config, weights), weights)
    return G.eval(), _info(config, metadata.get("step"))


def _from_checkpoint(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    state_file = path / ENGINE_STATE.format(rank=0)
    try:
        state = torch.load(state_file, map_location="cpu", weights_only=False)
    except Exception as error:
        raise CheckpointError(f"cannot read {state_file} (truncated or corrupt?): {error}") from error
    config = read_marker(path).get("config") or state["config"]
    G = _build(config, path)
    ema = state.get("callbacks", {}).get("ema")
    if ema is not None:  # the run samples from the EMA of G: so does this
        G.load_state_dict(ema["module"])
    else:
        load_weights(G, path / "model.safetensors")  # Accelerate's name for the first prepared model, G
    return G.eval(), _info(config, state["step"])


def _build(config: dict[str, Any], source: Path) -> nn.Module:
    model = config.get("extra", {}).get("model") or {}
    if not MODEL_KEYS <= set(model):
        raise CheckpointError(f"{source} does not record DCGAN model sizes (config.extra.model): load the weights "
                              "with gan_accel.state.load_weights into your own generator class")
    sizes = {key: model[key] for key in ("z_dim", "width", "image_size", "channels")}
    if model.get("conditional"):
        return ConditionalDCGANGenerator(model["num_classes"], **sizes)
    return DCGANGenerator(**sizes)


def _info(config: dict[str, Any], step: Any) -> dict[str, Any]:
    num_classes = config.get("num_classes")
    return {"config": config, "step": step, "conditional": num_classes is not None, "num_classes": num_classes}


@torch.no_grad()
def sample_images(G: nn.Module, info: dict[str, Any], num: int, label: int | None = None,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``num`` samples (N, C, H, W) in [-1, 1] and their labels (None for an unconditional G).

    A conditional G gives ``num`` samples of ``label``, or without one ``num // num_classes`` of
    each class, class by class. Raises :class:`ConfigError` for a label the run cannot take.
    """
    num_classes = info["num_classes"]
    if label is not None and not info["conditional"]:
        raise ConfigError("this run is unconditional (no num_classes): it cannot sample a chosen class; "
                         "leave out the label")
    if label is not None and not 0 <= label < num_classes:
        raise ConfigError(f"label {label} is outside the run's classes 0..{num_classes - 1}")
    generator = torch.Generator().manual_seed(seed)
    if not info["conditional"]:
        return G(torch.randn(num, G.z_dim, generator=generator)), None
    if label is not None:
        labels = torch.full((num,), label, dtype=torch.long)
    else:
        labels = torch.arange(num_classes).repeat_interleave(max(1, num // num_classes))
    z = torch.randn(len(labels), G.z_dim, generator=generator)
    return G(z, labels), labels
