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
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from .config import upgrade_config_dict
from .errors import CheckpointError, ConfigError
from .models import build_generator
from .state.checkpoint import engine_state_file, is_complete, list_checkpoints, read_engine_state, read_marker
from .state.layout import CHECKPOINTS, ENGINE_STATE, GENERATOR, RAW_GENERATOR, checkpoint_name
from .state.weights import load_weights, read_metadata

EMA_STATE_NAMES = ("generator_ema", "ema")  # the EMA callback's state in a checkpoint: its name now, and before
MAX_SAMPLES = 10_000_000  # what one call may ask for: a hard bound, said in one line, before any work
CHUNK = 512  # samples made (latents drawn, G run) at a time: memory does not grow with the number asked for
# What a recorded model spec may ask for (a file's metadata is checked against these before anything is
# built): far above any model gan_accel trains, far below a size that would exhaust memory by itself.
SPEC_BOUNDS = {"z_dim": 65_536, "width": 8_192, "d_width": 8_192, "channels": 64, "num_classes": 1_000_000}


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
    G = load_weights(_build(config, weights, _file_shapes(weights)), weights)
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
    callbacks = state["callbacks"]
    average = next((callbacks[name] for name in EMA_STATE_NAMES if name in callbacks), None)
    has_ema = isinstance(average, dict)
    if has_ema and ema:  # the run samples from the EMA of G: so does this
        module = average.get("module") if isinstance(average.get("module"), Mapping) else {}
        G = _build(config, path, {k: tuple(v.shape) for k, v in module.items() if isinstance(v, torch.Tensor)})
        _load_average(G, average, state_file)
        source = state_file
    else:
        source = path / RAW_GENERATOR
        if not source.is_file():
            raise CheckpointError(f"checkpoint {path} holds no weights of G ({RAW_GENERATOR} is missing): it was copied in "
                                  "part or damaged; pass another checkpoint of the run")
        G = load_weights(_build(config, path, _file_shapes(source)), source)
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


def _build(config: dict[str, Any], source: Path, shapes: Mapping[str, tuple[int, ...]]) -> nn.Module:
    """G from the run's recorded spec (:func:`gan_accel.models.build_generator`), once the spec is known to
    ask for sane sizes and to describe the weights there are (``shapes``: the file's tensors, read from its
    header): a spec is metadata, and a damaged one must not make this allocate gigabytes before any check."""
    spec = config.get("model")
    if not isinstance(spec, dict):
        raise CheckpointError(f"{source} records no model spec (config.model): load the weights with "
                              "gan_accel.state.load_weights into your own generator class")
    for key, bound in SPEC_BOUNDS.items():
        value = spec.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > bound:
            raise CheckpointError(f"{source} records a model spec with {key}={value}, beyond what gan_accel builds "
                                  f"(at most {bound:,}): the file is damaged or was not written by gan_accel")
    try:
        with torch.device("meta"):  # sizes only: nothing is allocated
            shell = build_generator(spec)
    except ConfigError as error:
        raise CheckpointError(f"{source} records a model spec gan_accel cannot rebuild ({error}): load the weights "
                              "with gan_accel.state.load_weights into your own generator class") from None
    _check_shapes(shell, shapes, source)
    return build_generator(spec)


def _file_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of a safetensors file, from its header (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{weights} is not a readable safetensors file (truncated or corrupt?): {error}") from None


def _check_shapes(shell: nn.Module, shapes: Mapping[str, tuple[int, ...]], source: Path) -> None:
    """The spec's G (on the meta device) must have the weights' keys and shapes, or nothing is built."""
    expected = {key: tuple(t.shape) for key, t in shell.state_dict().items()}
    if expected == dict(shapes):
        return
    missing, unexpected = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    wrong = [f"{k}: {shapes[k]} in the file, {expected[k]} in the spec" for k in sorted(set(expected) & set(shapes))
             if tuple(shapes[k]) != expected[k]]
    detail = "; ".join(part for part in (
        f"missing {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else "") if missing else "",
        f"unexpected {', '.join(unexpected[:3])}" + (" ..." if len(unexpected) > 3 else "") if unexpected else "",
        "; ".join(wrong[:2]) + (" ..." if len(wrong) > 2 else "")) if part)
    raise CheckpointError(f"{source}: the weights do not fit the model its recorded spec describes ({detail}): the "
                          "file is damaged, or its metadata was edited; pass another checkpoint of the run")


def _info(config: dict[str, Any], step: Any, ema: bool, has_ema: bool, weights: Path) -> dict[str, Any]:
    num_classes = config.get("num_classes")
    return {"config": config, "step": step, "conditional": num_classes is not None, "num_classes": num_classes,
            "ema": ema, "has_ema": has_ema, "weights": str(weights)}


def check_sample_request(info: dict[str, Any], num: int, label: int | None = None) -> None:
    """Refuse, in one line, a number of samples or a label the run cannot give (before any work)."""
    if not isinstance(num, int) or isinstance(num, bool) or not 1 <= num <= MAX_SAMPLES:
        raise ConfigError(f"num={num!r} samples: ask for 1 to {MAX_SAMPLES:,} at a time (several calls with other "
                          "seeds give more)")
    num_classes = info["num_classes"]
    if label is not None and not info["conditional"]:
        raise ConfigError("this run is unconditional (no num_classes): it cannot sample a chosen class; "
                          "leave out the label")
    if label is not None and not 0 <= label < num_classes:
        raise ConfigError(f"label {label} is outside the run's classes 0..{num_classes - 1}")


def sample_count(info: dict[str, Any], num: int, label: int | None = None) -> int:
    """How many samples :func:`iter_samples` gives: ``num``, or for a conditional run without a label
    ``num // num_classes`` of each class (at least one)."""
    if not info["conditional"] or label is not None:
        return num
    return info["num_classes"] * max(1, num // info["num_classes"])


def sample_labels(info: dict[str, Any], num: int, label: int | None, start: int, stop: int) -> torch.Tensor | None:
    """The labels of samples ``start`` to ``stop`` (class by class), None for an unconditional run."""
    if not info["conditional"]:
        return None
    if label is not None:
        return torch.full((stop - start,), label, dtype=torch.long)
    return torch.arange(start, stop) // max(1, num // info["num_classes"])


def _chunks(count: int, width: int, rows: int | None = None) -> Iterator[tuple[int, int]]:
    """(start, stop) of the chunks of ``count`` latents of ``width`` numbers each.

    ``torch.randn`` of n numbers on the CPU draws in blocks of 16 and redraws its last 16 when n is not a
    multiple of 16, so chunks of a multiple of 16 rows, and a last chunk of at least 16 numbers, draw
    exactly the numbers one call for all of them would: the same seed gives the same samples whatever
    the chunking (a tail of fewer than 16 numbers joins the chunk before it).
    """
    rows = rows or CHUNK
    start = 0
    while start < count:
        take = min(rows, count - start)
        if 0 < (count - start - take) * width < 16:
            take = count - start
        yield start, start + take
        start += take


@torch.no_grad()
def iter_samples(G: nn.Module, info: dict[str, Any], num: int, label: int | None = None,
                 seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """The samples of :func:`sample_images`, chunk by chunk: ``(images, labels)`` of at most a few hundred
    samples at a time, so any ``num`` up to :data:`MAX_SAMPLES` runs in the memory of one chunk."""
    check_sample_request(info, num, label)
    count = sample_count(info, num, label)
    generator = torch.Generator().manual_seed(seed)
    for start, stop in _chunks(count, G.z_dim):
        z = torch.randn(stop - start, G.z_dim, generator=generator)
        labels = sample_labels(info, num, label, start, stop)
        yield (G(z) if labels is None else G(z, labels)), labels


def sample_images(G: nn.Module, info: dict[str, Any], num: int, label: int | None = None,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``num`` samples (N, C, H, W) in [-1, 1] and their labels (None for an unconditional G), all at once.

    A conditional G gives ``num`` samples of ``label``, or without one ``num // num_classes`` of
    each class, class by class. Raises :class:`ConfigError` for a label the run cannot take, or more
    than :data:`MAX_SAMPLES`. The latents come from ``seed`` (the same numbers as one draw of all of
    them); G runs on a chunk of them at a time (in eval mode each sample's image depends on its latent
    and label only). For many samples, :func:`iter_samples` keeps only one chunk in memory.
    """
    parts = list(iter_samples(G, info, num, label, seed))
    images = torch.cat([images for images, _ in parts])
    return images, (None if parts[0][1] is None else torch.cat([labels for _, labels in parts]))
