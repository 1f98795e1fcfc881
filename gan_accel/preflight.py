"""Checks that run before training, so a mistake costs seconds, not a failed run.

Each check raises :class:`PreflightError` naming the problem and the fix. The dry forward runs on
a tiny batch with the global RNG and the BatchNorm buffers put back afterwards, so it does not
change the run it protects.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from .checkpoint import list_checkpoints


class PreflightError(ValueError):
    """The models, the data or the output folder cannot make a valid run."""


def check_dataloader(dataloader: DataLoader, batch_size: int) -> None:
    """Empty datasets and a batch size larger than the dataset (with drop_last) are refused."""
    dataset = getattr(dataloader, "dataset", None)
    try:
        n_items = len(dataset) if dataset is not None else None
    except TypeError:
        n_items = None  # iterable datasets have no length
    if n_items == 0:
        raise PreflightError("the training dataset is empty: check the data path and any filtering")
    try:
        n_batches = len(dataloader)
    except TypeError:
        return
    if n_batches == 0:
        loader_batch = getattr(dataloader, "batch_size", None) or batch_size
        raise PreflightError(
            f"the dataloader yields no batches: batch size {loader_batch} is larger than the dataset "
            f"({n_items} items) and drop_last=True; use a smaller batch size or more data"
        )
    loader_batch = getattr(dataloader, "batch_size", None)
    if loader_batch is not None and loader_batch != batch_size:
        raise PreflightError(
            f"the dataloader's batch_size={loader_batch} differs from config.batch_size={batch_size}: "
            "build the DataLoader with the config's batch size (it is the per-process batch)"
        )


def dry_forward(G: nn.Module, D: nn.Module, dataloader: DataLoader, latent_sampler, extract_images) -> None:
    """One tiny forward of G, D(real) and D(G(z)), leaving RNG and BatchNorm statistics untouched."""
    buffers = {id(b): b.detach().clone() for m in (G, D) for b in m.buffers()}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            batch = next(iter(dataloader))
        except StopIteration:
            raise PreflightError("the dataloader yields no batches") from None
        try:
            real = extract_images(batch)
        except TypeError as error:
            raise PreflightError(str(error)) from None
        real = real[:2]
        device = _device_of(D) or real.device
        real = real.to(device)
        z = latent_sampler(real.shape[0], _device_of(G) or device)
        try:
            fake = G(z)
        except Exception as error:
            raise PreflightError(f"G failed on latents of shape {tuple(z.shape)}: {error}") from error
        if not isinstance(fake, torch.Tensor):
            raise PreflightError(f"G must return an image tensor, got {type(fake).__name__}")
        if tuple(fake.shape[1:]) != tuple(real.shape[1:]):
            raise PreflightError(
                f"G produces images of shape {tuple(fake.shape[1:])} but the data has {tuple(real.shape[1:])}: "
                "make G's output size and channels match the dataset (or resize the data)"
            )
        for name, images in (("real images", real), ("G's images", fake.to(device))):
            try:
                logits = D(images)
            except Exception as error:
                raise PreflightError(f"D failed on {name} of shape {tuple(images.shape)}: {error}") from error
            if not isinstance(logits, torch.Tensor) or logits.numel() != images.shape[0] or logits.shape[0] != images.shape[0]:
                shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                raise PreflightError(
                    f"D must return one logit per image, shape ({images.shape[0]},) or ({images.shape[0]}, 1), "
                    f"but returned {shape} for {images.shape[0]} {name}: end D with a single-output layer and no "
                    "pooling over the batch"
                )
    for m in (G, D):
        for b in m.buffers():
            b.copy_(buffers[id(b)])


def _device_of(module: nn.Module) -> torch.device | None:
    param = next(module.parameters(), None)
    return param.device if param is not None else None


RUN_FILES = ("config.json", "metrics.jsonl", "generator.safetensors")


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
    import shutil

    path = Path(output_dir)
    if not path.is_dir():
        return
    patterns = [*RUN_FILES, "samples_*.png", "progress.gif", "fixed_noise.pt", "eval.json"]
    for pattern in patterns:
        for file in path.glob(pattern):
            file.unlink()
    shutil.rmtree(path / "checkpoints", ignore_errors=True)

