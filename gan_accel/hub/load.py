"""Loading a generator without training code (a local export, a run, a checkpoint or a Hub repo), and pushing an
export to the Hugging Face Hub.

Loading never executes code from what it reads: ``config.json`` is JSON, the weights are safetensors
(an export, a run's ``generator.safetensors``); a checkpoint is read as :func:`gan_accel.sampling.load_generator`
reads it. ``huggingface_hub`` is an optional extra (``pip install 'gan_accel[hub]'``), imported only to
download or upload.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..models import build_generator
from ..sampling import load_generator as load_run_generator
from ..state.checkpoint import is_complete
from ..state.layout import EXPORT_CARD, EXPORT_CONFIG, EXPORT_SAMPLES, EXPORT_WEIGHTS, checkpoint_run_folder, read_json
from ..state.weights import load_weights
from .export import FORMAT, FORMAT_VERSION, ExportError, class_names_of

HUB_HINT = "pip install 'gan_accel[hub]'"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by :func:`~gan_accel.hub.export_generator`."""
    path = Path(path)
    try:
        config = read_json(path / EXPORT_CONFIG)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT


def read_export_config(path: str | os.PathLike) -> dict[str, Any]:
    """An export's ``config.json``, checked: one line naming the problem when it cannot be used."""
    file = Path(path) / EXPORT_CONFIG
    try:
        config = read_json(file)
    except OSError as error:
        raise ExportError(f"{file} cannot be read ({error.strerror or error}): pass a folder written by gan-accel "
                          "export") from None
    except ValueError as error:
        raise ExportError(f"{file} is not valid JSON ({error}): the export is damaged; export the run again") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ExportError(f"{file} is not a gan_accel export's config (no \"format\": \"{FORMAT}\"): pass a folder "
                          "written by gan-accel export, a run folder or a checkpoint")
    if int(config.get("format_version", 0)) > FORMAT_VERSION:
        raise ExportError(f"{path} was exported by gan_accel {config.get('gan_accel_version')} in a newer format "
                          f"(version {config['format_version']}): upgrade gan_accel to load it")
    return config


def load_export(path: str | os.PathLike) -> nn.Module:
    """G from an export folder, in eval mode, with ``G.class_names`` (None when unconditional or unnamed)."""
    path = Path(path)
    config = read_export_config(path)
    try:
        G = build_generator(config["model"])
    except (ConfigError, KeyError, TypeError) as error:
        raise ExportError(f"{path}/{EXPORT_CONFIG} records a model gan_accel cannot build ({error}): it was written "
                          "by another version; upgrade gan_accel") from None
    load_weights(G, path / config.get("weights", {}).get("file", EXPORT_WEIGHTS))
    G.class_names = config.get("class_names")
    return G.eval()


def download(repo_id: str, revision: str | None = None, token: str | None = None) -> Path:
    """The export files of a Hub model repo, through ``huggingface_hub.snapshot_download`` (its cache)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ExportError(f"{repo_id} is not a local folder, and loading from the Hugging Face Hub needs "
                          f"huggingface_hub: {HUB_HINT} (or pass the exported folder)") from None
    try:
        folder = snapshot_download(repo_id=repo_id, revision=revision, token=token, repo_type="model",
                                   allow_patterns=[EXPORT_CONFIG, EXPORT_WEIGHTS, EXPORT_CARD, EXPORT_SAMPLES])
    except Exception as error:  # offline, unknown repo, no access: all fixable by the user
        raise ExportError(f"{repo_id} is not a local folder, and downloading it from the Hugging Face Hub failed "
                          f"({_reason(error, token)}): check the repo id, your access and the network, or pass "
                          "the exported folder") from None
    return Path(folder)


def load_generator(source: str | os.PathLike, *, ema: bool = True, device: str | torch.device | None = None,
                   revision: str | None = None, token: str | None = None) -> nn.Module:
    """A trained G, in eval mode, from an export folder, a Hub repo id, a run folder or a checkpoint folder.

    * an export (``gan-accel export``): ``config.json`` + ``model.safetensors``, no training code;
    * a Hub repo id (``"user/name"``) that is not a local path: downloaded with ``huggingface_hub``
      (``revision``, ``token``), then loaded as an export;
    * a run folder or a checkpoint: as :func:`gan_accel.sampling.load_generator` (``ema=False``: the raw G),
      which also returns the run's info; this one returns G alone.

    ``G.class_names`` holds the class names of a conditional G (None otherwise); ``G.z_dim`` the latent size.
    """
    path = Path(source)
    if path.exists():
        G = load_export(path) if is_export(path) else _from_run(path, ema)
    elif REPO_ID.match(str(source)) and not str(source).startswith("."):
        G = load_export(download(str(source), revision, token))
    else:
        raise ExportError(f"{source} does not exist: pass an exported folder, a Hub repo id (user/name), a run "
                          "folder or a checkpoint folder")
    return G.to(device) if device is not None else G


def _from_run(path: Path, ema: bool) -> nn.Module:
    G, info = load_run_generator(path, ema=ema)
    run = checkpoint_run_folder(path) if is_complete(path) else path
    G.class_names = class_names_of(run, info["num_classes"])
    return G


def _reason(error: BaseException, token: str | None) -> str:
    """An error's type and first line, with the token (if any) blanked out."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text.replace(token, "***") if token else text


def push_to_hub(folder: str | os.PathLike, repo_id: str, *, private: bool = False, token: str | None = None,
                commit_message: str = "Upload a gan_accel generator") -> str:
    """Create the model repo ``repo_id`` (if new) and upload the export ``folder``; returns the repo's URL.

    ``token``: a Hugging Face token with write access (default: ``huggingface_hub``'s own, from
    ``hf auth login`` or ``$HF_TOKEN``). It is never printed.
    """
    read_export_config(folder)
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ExportError(f"pushing to the Hugging Face Hub needs huggingface_hub: {HUB_HINT}; the export in {folder} "
                          "is complete, push it later with gan-accel export's --push-to-hub or huggingface_hub") from None
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=commit_message)
    except Exception as error:  # no network, no write access, a bad name: one line
        raise ExportError(f"could not push {folder} to the Hugging Face Hub as {repo_id} ({_reason(error, token)}): "
                          "check the repo id, your token's write access and the network; the export itself is "
                          "complete") from None
    return str(url)
