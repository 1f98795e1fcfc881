"""Accelerator construction and launch sanity checks."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import (DataLoaderConfiguration, DistributedDataParallelKwargs, DistributedType,
                              GradientAccumulationPlugin, InitProcessGroupKwargs, ProjectConfiguration)

from ..config import TrainConfig
from ..errors import ConfigError, LaunchError
from ..storage.layout import TRACKERS
from ..tracking import resolve_trackers, tracker_name


def build_accelerator(config: TrainConfig) -> Accelerator:
    """The Accelerator the engine builds when the user does not pass one.

    ``sync_with_dataloader=False``: accumulation windows run across epoch ends (a true larger batch). No
    buffer syncing in DDP's forward (:func:`ddp_kwargs`): D runs on real and fake images before one
    backward, and re-broadcasting BatchNorm buffers in between breaks autograd on CUDA. A seedable sampler:
    the order is a function of (seed, epoch), so a resumed run skips to the same position. The installed
    trackers of ``config.log_with``, logging under ``<run>/trackers/``.
    """
    check_sharding_not_requested()  # before Accelerate tries to set DeepSpeed or FSDP up
    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=config.grad_accum_steps, sync_with_dataloader=False
        ),
        # no collective waits longer than this for a process (stopped, hung, dead): see gan_accel.ending
        kwargs_handlers=[ddp_kwargs(), InitProcessGroupKwargs(timeout=timedelta(seconds=config.collective_timeout))],
        # data_seed: without it the sampler seeds itself from torch's initial seed, which differs per
        # process once noise is seeded per process, and the ranks would shard different permutations.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
        log_with=resolve_trackers(config.log_with)[0] or None,
        project_config=ProjectConfiguration(project_dir=str(config.output_dir),
                                            logging_dir=str(Path(config.output_dir) / TRACKERS)),
    )
    check_launch(accelerator)  # before the caller loads data or builds models
    note = idle_gpus_note(accelerator.num_processes)
    if note:
        accelerator.print(note)
    return accelerator


def idle_gpus_note(num_processes: int, argv: list[str] | None = None) -> str | None:
    """One line when several GPUs are visible but one process runs (plain ``python`` or ``gan-accel`` trains on
    one GPU, silently otherwise), naming the launch that trains on all of them; None otherwise."""
    import torch

    count = torch.cuda.device_count()
    if num_processes != 1 or count < 2:
        return None
    return (f"gan_accel: {count} GPUs are visible but 1 process trains, on one: `accelerate launch --num_processes "
            f"{count} {launch_target(sys.argv if argv is None else argv)} ...` (the same flags) trains on all {count}")


def launch_target(argv: list[str]) -> str:
    """What ``accelerate launch`` runs for this program: ``-m gan_accel.cli train`` for the command, else the script."""
    program = Path(argv[0]) if argv else Path("train.py")
    if program.name == "gan-accel" or program.parts[-3:] == ("gan_accel", "cli", "__main__.py"):
        command = next((a for a in argv[1:] if not a.startswith("-")), "train")
        return f"-m gan_accel.cli {command}"
    return str(program) if program.suffix == ".py" else "your_script.py"


def ddp_kwargs() -> DistributedDataParallelKwargs:
    """DDP without buffer syncing in forward, by the current name of that switch (torch 2.13 renamed
    ``broadcast_buffers``): Accelerate's field, else passed on to DDP (Accelerate <= 1.16), else the old name."""
    if "forward_sync_buffers" in {field.name for field in dataclasses.fields(DistributedDataParallelKwargs)}:
        return DistributedDataParallelKwargs(forward_sync_buffers=False)
    if not ddp_takes("forward_sync_buffers"):
        return DistributedDataParallelKwargs(broadcast_buffers=False)
    handler = DistributedDataParallelKwargs()

    def to_kwargs() -> dict[str, Any]:
        # Accelerate passes handler.to_kwargs() to DistributedDataParallel(...); a twin without this override
        # gives the fields' own (so a field changed later still counts), then the new name is added.
        twin = DistributedDataParallelKwargs(**{f.name: getattr(handler, f.name)
                                                for f in dataclasses.fields(DistributedDataParallelKwargs) if f.init})
        return {**twin.to_kwargs(), "forward_sync_buffers": False}

    handler.to_kwargs = to_kwargs  # Accelerate maps handlers by exact class: a subclass would not be accepted
    return handler


def ddp_takes(argument: str) -> bool:
    """Whether this torch's ``DistributedDataParallel`` takes ``argument``."""
    from torch.nn.parallel import DistributedDataParallel

    return argument in inspect.signature(DistributedDataParallel.__init__).parameters


_KINDS = {"DEEPSPEED": "DeepSpeed", "FSDP": "FSDP", "XLA": "XLA", "MEGATRON_LM": "Megatron-LM"}


def describe_launch(accelerator: Accelerator) -> str:
    """The launch in words: ``1 process on cpu``, ``2 processes (DDP, gloo) on cpu``, ``8 processes (DDP, nccl)
    on cuda:0``."""
    n, kind = accelerator.num_processes, accelerator.distributed_type.value
    device = getattr(accelerator, "device", None)
    where = "cpu" if device is None or device.type == "cpu" else str(device)  # "cpu:0" under DDP reads "cpu"
    if n == 1 and kind == "NO":
        return f"1 process on {where}"
    name = "DDP" if kind.startswith("MULTI_") else _KINDS.get(kind, kind.replace("_", " ").title())
    backend = getattr(getattr(accelerator, "state", None), "backend", None)
    how = ", ".join(str(part) for part in (name, backend) if part)
    return f"{n} process{'es' if n != 1 else ''} ({how}) on {where}"


SHARDING_REFUSED = (
    "gan_accel trains two networks with their own optimizers and alternating updates; Accelerate's DeepSpeed "
    "integration prepares one model per Accelerator, and under FSDP the per-network freezing, no_sync and "
    "clipping that keep GAN updates correct are not proven: this is not supported yet. Use DDP instead "
    "(`accelerate config`: multi-GPU, answer no to DeepSpeed and FSDP), which gan_accel's tests prove "
    "equal to one process with the larger batch"
)


def check_sharding_not_requested() -> None:
    """Refuse a launch configured for DeepSpeed or FSDP (Accelerate reads these variables from the config)."""
    for variable, name in (("ACCELERATE_USE_DEEPSPEED", "DeepSpeed"), ("ACCELERATE_USE_FSDP", "FSDP")):
        if os.environ.get(variable, "false").strip().lower() in ("1", "true", "yes"):
            raise LaunchError(f"this launch asks for {name} ({variable}={os.environ[variable]}): {SHARDING_REFUSED}")


def check_launch(accelerator: Accelerator) -> None:
    """Stop when the Accelerator shards, or several processes were launched but it is not distributed (e.g.
    ``--multi_gpu`` without GPUs nor ``ACCELERATE_USE_CPU=1``: each would train its own duplicate copy)."""
    if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        raise LaunchError(f"the Accelerator uses {describe_launch(accelerator)}: {SHARDING_REFUSED}")
    # the number of processes the launcher (torchrun / accelerate launch / mpirun) says it started
    world = next((int(os.environ[v]) for v in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
                  if os.environ.get(v, "").isdigit()), 1)
    if world > 1 and accelerator.num_processes == 1:
        raise LaunchError(
            f"{world} processes were launched but Accelerate sees only one ({describe_launch(accelerator)}): each "
            "process would train its own duplicate model. "
            "On a machine without GPUs run `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu "
            "--num_processes N ...` (gloo backend); on GPUs check `accelerate env` and your config file."
        )


def check_accelerator(accelerator: Accelerator, config: TrainConfig) -> None:
    """A user-built Accelerator must agree with the config on what the engine relies on."""
    if accelerator.gradient_accumulation_steps != config.grad_accum_steps:
        raise ConfigError(
            f"accelerator.gradient_accumulation_steps={accelerator.gradient_accumulation_steps} but "
            f"config.grad_accum_steps={config.grad_accum_steps}: build the Accelerator with "
            "GradientAccumulationPlugin(num_steps=config.grad_accum_steps, sync_with_dataloader=False), "
            "or let the trainer build it"
        )
    if accelerator.mixed_precision != config.mixed_precision:
        raise ConfigError(
            f"accelerator.mixed_precision={accelerator.mixed_precision!r} but config.mixed_precision="
            f"{config.mixed_precision!r}: make them agree, or let the trainer build the Accelerator"
        )
    if accelerator.gradient_state.plugin_kwargs.get("sync_with_dataloader", True) and config.grad_accum_steps > 1:
        raise ConfigError(
            "the accelerator forces an optimizer step at every epoch end (sync_with_dataloader=True), so "
            "accumulation windows would be cut short: pass GradientAccumulationPlugin(num_steps=..., "
            "sync_with_dataloader=False), or let the trainer build the Accelerator"
        )
    check_trackers(accelerator, config)


def check_trackers(accelerator: Accelerator, config: TrainConfig) -> None:
    """A user-built Accelerator must log with the installed trackers ``config.log_with`` names (more are fine);
    ``("all",)`` takes its trackers as they are."""
    have = [tracker_name(t) for t in accelerator.log_with]
    if not config.log_with:
        if have:
            accelerator.print(f"gan_accel: note: the Accelerator you passed has trackers ({', '.join(have)}) but "
                              "config.log_with is empty: gan_accel logs nothing to them; set log_with=('all',) to log "
                              "the metrics and samples to them")
        return
    if "all" in config.log_with:
        return
    wanted = resolve_trackers(config.log_with)[0]
    lacking = [name for name in wanted if name not in have]
    if lacking:
        raise ConfigError(
            f"config.log_with asks for {', '.join(lacking)} but the Accelerator you passed logs with "
            f"{', '.join(have) or 'no tracker'}: build it with Accelerator(log_with={wanted!r}, "
            "project_dir=config.output_dir), or with gan_accel.build_accelerator(config), or leave it out"
        )
