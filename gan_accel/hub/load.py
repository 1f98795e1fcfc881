"""The one way a trained G is read: :func:`read_generator`, from an export, a run, a checkpoint or a Hub repo
(:func:`gan_accel.load_generator` adds the Hub methods to what it returns); and :func:`push_to_hub` of a folder.

Loading never executes code from what it reads: ``config.json`` is JSON, the weights are safetensors,
a checkpoint's engine state is read in safe formats only. Every model spec read from a file is checked
against fixed bounds and built on the meta device against the weights' header shapes before any memory
is spent on G. ``huggingface_hub`` is imported only to download or upload.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from torch import nn

from ..errors import CheckpointError, ConfigError, ExportError
from ..models import build_generator, normalize_spec
from ..storage.checkpoint import is_complete, list_checkpoints, read_engine_state, read_marker
from ..storage.layout import (CHECKPOINTS, EMA_STATE, ENGINE_STATE, EXPORT_CARD, EXPORT_CONFIG, EXPORT_SAMPLES,
                              EXPORT_WEIGHTS, GENERATOR, RAW_GENERATOR, checkpoint_name, checkpoint_run_folder,
                              read_json)
from ..storage.files import first_line
from ..storage.finite import check_finite
from ..storage.reading import check_regular_file, load_safetensors, open_safetensors
from ..storage.weights import FORMAT, FORMAT_VERSION, generator_config
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
# What a recorded model spec may ask for (checked before anything is built): far above any model gan_accel
# trains, far below a size that would exhaust memory by itself.
SPEC_BOUNDS = {"z_dim": 65_536, "width": 8_192, "d_width": 8_192, "image_size": 8_192, "channels": 64,
               "num_classes": 1_000_000}


def read_generator(source: str | os.PathLike, *, ema: bool = True, revision: str | None = None,
                   token: str | None = None) -> nn.Module:
    """A trained G, in eval mode, from an export folder, a run folder, a checkpoint folder or a Hub repo id.

    * an export (``gan-accel export``), or a run's ``generator/`` folder: ``config.json`` + ``model.safetensors``;
    * a finished run folder: its ``generator/`` (``ema=False``: the raw G, from the checkpoint of its last step);
    * a ``checkpoints/checkpoint_<step>`` folder: its EMA of G when the run kept one (``ema=False``: the raw G);
    * a Hub repo id (``"user/name"``) that is not a local path: downloaded with ``huggingface_hub``
      (``revision``, ``token``), then read as an export.

    ``G.info`` and ``G.class_names`` say what it is (:func:`gan_accel.load_generator`).
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"load_generator takes a folder's path or a Hub repo id (str or os.PathLike), not "
                        f"{type(source).__name__}")
    path = Path(source)
    if is_complete(path):
        G = _from_checkpoint(path, ema)
    elif path.is_dir() and not _is_generator_folder(path) and not (path / EXPORT_WEIGHTS).exists():
        # a run folder; a folder with its own weights is an export, whose damaged config.json is named as such
        G = _from_run(path, ema)
    elif path.exists():
        G = _from_folder(path)
        if not ema and G.info["weights"].get("ema"):  # an export keeps one G: never the EMA in the raw G's stead
            raise CheckpointError(f"{path} holds the EMA of G only, not the raw G that ema=False (--no-ema) asks for: "
                                  "pass the run folder or a checkpoint of it, or export it with --no-ema")
    elif REPO_ID.match(str(source)) and not str(source).startswith("."):
        G = _from_folder(download(str(source), revision, token))
    else:
        raise ExportError(f"{source} does not exist: pass an exported folder, a Hub repo id (user/name), a run "
                          "folder or a checkpoint folder")
    return G


def usable_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` checked before any file is read: a CUDA device this machine lacks is one line, not torch's."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"device={device!r} is not a device torch knows ({first_line(error)}): pass 'cpu', 'cuda' "
                          "or 'cuda:N'") from None
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ConfigError(f"device={str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                          "pass device='cpu' or one that exists")
    return device


def read_export_config(folder: str | os.PathLike) -> dict[str, Any]:
    """A generator folder's ``config.json``, checked: one line naming the problem when it cannot be used."""
    file = Path(folder) / EXPORT_CONFIG
    try:
        check_regular_file(file)
        config = read_json(file)
    except OSError as error:
        raise ExportError(f"{file} cannot be read ({error.strerror or error}): pass a folder written by gan-accel "
                          "export") from None
    except ValueError as error:
        raise ExportError(f"{file} is not valid JSON ({error}): the folder is damaged; export the run again") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ExportError(f"{file} is not a gan_accel generator's config (no \"format\": \"{FORMAT}\"): pass a "
                          "folder written by gan-accel export, a run folder or a checkpoint")
    version = config.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ExportError(f"{folder} was written by gan_accel {str(config.get('gan_accel_version'))[:40]} in another "
                          f"format (version {str(version)[:40]}): upgrade gan_accel to load it")
    weights = config.get("weights")
    if not isinstance(weights, dict) or weights.get("file", EXPORT_WEIGHTS) != EXPORT_WEIGHTS:
        named = weights.get("file") if isinstance(weights, dict) else weights
        raise ExportError(f"{file} names the weights {str(named)[:80]!r}: gan_accel reads only {EXPORT_WEIGHTS} "
                          "inside the folder itself; restore \"weights\": {\"file\": \"model.safetensors\", ...}")
    return config


def _is_generator_folder(path: Path) -> bool:
    """Whether ``path`` holds a generator's ``config.json`` (an export or a run's ``generator/``)."""
    if not (path / EXPORT_CONFIG).is_file():  # a FIFO is no file: reading it would wait forever
        return False
    try:
        config = read_json(path / EXPORT_CONFIG)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT


def _from_folder(folder: Path) -> nn.Module:
    """G of a generator folder (an export, or a run's ``generator/``)."""
    config = read_export_config(folder)
    weights = folder / EXPORT_WEIGHTS
    if weights.is_symlink() and weights.resolve().parent != folder.resolve():
        raise ExportError(f"{weights} is a link to {weights.resolve()}, out of its folder: gan_accel reads a generator's "
                          "weights only from its own folder; copy the file in, or export the run again")
    return _described(_build(config.get("model"), weights, spec_file=folder / EXPORT_CONFIG), config)


def _from_run(run: Path, ema: bool) -> nn.Module:
    folder = run / GENERATOR
    if not folder.is_dir():
        latest = list_checkpoints(run)
        where = f", or pass one of its checkpoints ({latest[-1]})" if latest else ""
        raise CheckpointError(f"{folder} not found: pass a finished gan_accel run folder (G is written there when "
                              f"training ends){where}, an exported folder or a checkpoint folder")
    G = _from_folder(folder)
    if ema or not G.info["weights"]["ema"]:
        return G
    step = G.info["weights"]["step"]  # the run's G is the EMA: the raw G is in the checkpoint of that step
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{folder}/{EXPORT_CONFIG} records step {str(step)[:40]!r}, which is not a step: the "
                              "file was changed or damaged; pass one of the run's checkpoint folders instead")
    checkpoint = run / CHECKPOINTS / checkpoint_name(step)
    if not is_complete(checkpoint):
        found = [p.name for p in list_checkpoints(run)]
        raise CheckpointError(
            f"{folder} holds the EMA of G only, and the raw G of step {step} is kept in {checkpoint}, which is gone: "
            f"pass a checkpoint folder to sample its raw G (complete ones: {', '.join(found) or 'none'}), or leave "
            "out --no-ema / ema=False")
    return _from_checkpoint(checkpoint, ema=False)


def _from_checkpoint(path: Path, ema: bool) -> nn.Module:
    state = read_engine_state(path, 0)  # safe formats only: nothing in it can run code
    state_file = path / ENGINE_STATE.format(rank=0)
    marker_config = read_marker(path).get("config")
    config = marker_config if isinstance(marker_config, dict) and marker_config else state["config"]
    average = state["callbacks"].get(EMA_STATE)
    has_ema = isinstance(average, dict)
    if has_ema and ema:  # the run samples from the EMA of G: so does this
        weights = average.get("module")
        if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
            raise CheckpointError(f"{state_file} holds no EMA weights of G (its EMA state has no tensors under "
                                  "'module'): the checkpoint was damaged; pass another checkpoint, or --no-ema / ema=False")
        G = _build(config.get("model"), state_file, weights)
    else:
        if not (path / RAW_GENERATOR).is_file():
            raise CheckpointError(f"checkpoint {path} holds no weights of G ({RAW_GENERATOR} is missing): it was copied "
                                  "in part or damaged; pass another checkpoint of the run")
        G = _build(config.get("model"), path / RAW_GENERATOR)
    return _described(G, generator_config(config, state["step"], has_ema and ema, has_ema, checkpoint_run_folder(path)))


def _described(G: nn.Module, info: dict[str, Any]) -> nn.Module:
    G.info = {**info, "model": normalize_spec(info["model"])}  # checked by _build: every key, defaults filled in
    names, num_classes = info.get("class_names"), G.info["model"]["num_classes"]
    ok = isinstance(names, list) and len(names) == num_classes and all(isinstance(n, str) for n in names)
    G.class_names = names if ok else None
    return G.eval()


def _build(spec: Any, source: Path, weights: Mapping[str, torch.Tensor] | None = None,
           spec_file: Path | None = None) -> nn.Module:
    """G from a recorded spec with ``weights`` (default: the safetensors file ``source``) loaded, once the spec is
    known to ask for sane sizes and to fit the weights' shapes (a file's are read from its header): a spec is data
    from a file, and a damaged or hostile one must not make this allocate gigabytes before any check."""
    shapes = _file_shapes(source) if weights is None else {k: tuple(v.shape) for k, v in weights.items()}
    recorded = spec_file or source  # the file the spec was read from: the one to name when it is wrong
    if not isinstance(spec, dict):
        raise CheckpointError(f"{recorded} records no model spec (config.model): load the weights with "
                              "gan_accel.storage.load_weights into your own generator class")
    for key, bound in SPEC_BOUNDS.items():
        value = spec.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > bound:
            raise CheckpointError(f"{recorded} records a model spec with {key}={value}, beyond what gan_accel builds "
                                  f"(at most {bound:,}): the file is damaged or was not written by gan_accel")
    try:
        with torch.device("meta"):  # sizes only: nothing is allocated
            shell = build_generator(spec)
    except (ConfigError, TypeError, ValueError) as error:
        raise CheckpointError(f"{recorded} records a model spec gan_accel cannot rebuild ({error}): load the weights "
                              "with gan_accel.storage.load_weights into your own generator class") from None
    expected = {key: tuple(t.shape) for key, t in shell.state_dict().items()}
    differ = [k for k in sorted(set(expected) | set(shapes)) if expected.get(k) != shapes.get(k)]
    if differ:
        k = differ[0]
        raise CheckpointError(f"{source}: the weights do not fit the model its recorded spec describes ({k}: "
                              f"{shapes.get(k, 'absent')} in the file, {expected.get(k, 'absent')} in the spec): the "
                              "file is damaged, or its config was edited; export the run again")
    state = load_safetensors(source) if weights is None else weights
    check_finite(state, source, "tensor" if weights is None else "the EMA of G's tensor")  # never a black grid
    G = build_generator(spec)
    try:
        G.load_state_dict(state)
    except RuntimeError as error:  # the shapes matched: a dtype or an odd tensor
        raise CheckpointError(f"the weights in {source} do not fit the generator its config describes: "
                              f"{str(error).strip().splitlines()[0]}") from None
    return G


def _file_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of a safetensors file, from its header (no tensor is read)."""
    try:
        with open_safetensors(weights) as handle:
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{weights} is not a readable safetensors file (truncated or corrupt?): "
                              f"{str(error).strip()[:200]}") from None


def download(repo_id: str, revision: str | None = None, token: str | None = None) -> Path:
    """The export files of a Hub model repo, through ``huggingface_hub.snapshot_download`` (its cache)."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id=repo_id, revision=revision, token=token, repo_type="model",
                                   allow_patterns=[EXPORT_CONFIG, EXPORT_WEIGHTS, EXPORT_CARD, EXPORT_SAMPLES])
    except Exception as error:  # offline, unknown repo, no access: all fixable by the user
        raise hub_failure(f"{repo_id} is not a local folder, and downloading it from the Hugging Face Hub failed",
                          error, token, ", or pass the exported folder") from None
    return Path(folder)


def hub_failure(what: str, error: BaseException, token: Any = None, other: str = "") -> ExportError:
    """One line for a failed exchange with the Hub: what failed, the error's type and first line (the token, if
    any, blanked out), and the fix (``other``: the end of the line)."""
    text = f"{type(error).__name__}: {first_line(error)}" if str(error).strip() else type(error).__name__
    text = text.replace(token, "***") if isinstance(token, str) and token else text
    return ExportError(f"{what} ({text}): check the repo id, your access and the network{other}")


def push_to_hub(folder: str | os.PathLike, repo_id: str, *, private: bool = False, token: str | None = None,
                commit_message: str = "Upload a gan_accel generator") -> str:
    """Create the model repo ``repo_id`` (if new) and upload the export ``folder``; returns the repo's URL.

    ``token``: a Hugging Face token with write access (default: ``huggingface_hub``'s own, from
    ``hf auth login`` or ``$HF_TOKEN``). It is never printed.
    """
    from huggingface_hub import HfApi

    read_export_config(folder)
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=commit_message)
    except Exception as error:  # no network, no write access, a bad name: one line
        raise hub_failure(f"could not push {folder} to the Hugging Face Hub as {repo_id}", error, token,
                          "; the export itself is complete") from None
    return str(url)
