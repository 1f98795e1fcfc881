"""Building a run: default optimizers and schedulers for every network, then the one ``prepare`` call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from accelerate import Accelerator
from torch import nn

from ..config import Ramp, TrainConfig
from ..errors import PreflightError
from ..processes import bound_waits
from .phases import PhasePlan
from .schedules import (LRMultiplier, StepRamps, first_value, lambda_scheduler, scheduler_ticks_per_optimizer_step,
                        warmup_then_decay)
from .speed import apply_memory_format, check_speed_options, keep_freed_memory, training_views

ExtraNetwork = nn.Module | tuple[nn.Module, torch.optim.Optimizer]


@dataclass
class Prepared:
    """What ``accelerator.prepare`` returned, by network name."""

    networks: dict[str, nn.Module]
    optimizers: dict[str, Any]
    schedulers: dict[str, Any]
    dataloader: Any
    built: frozenset[str] = frozenset()  # networks whose optimizer and scheduler gan_accel built from the config
    train_networks: dict[str, Any] | None = None  # what the phase runner trains through (compiled G, D with compile)
    ramps: StepRamps | None = None  # the config's rate and betas Ramps, set at the start of each step


def collect_networks(G: nn.Module, D: nn.Module, opt_G: Any, opt_D: Any,
                     extra: Mapping[str, ExtraNetwork] | None) -> tuple[dict[str, nn.Module], dict[str, Any]]:
    """Networks and (possibly None) optimizers by name: G, D, then the extras in their order."""
    nets, optimizers = {"G": G, "D": D}, {"G": opt_G, "D": opt_D}
    for name, item in (extra or {}).items():
        if name in nets:
            raise PreflightError(f"extra network name {name!r} is taken: use another name than 'G' and 'D'")
        nets[name], optimizers[name] = item if isinstance(item, tuple) else (item, None)
    for name, net in nets.items():
        if not isinstance(net, nn.Module):
            raise PreflightError(f"{name} is a {type(net).__name__}, not a torch.nn.Module: pass the network itself")
    _refuse_shared(nets)
    return nets, optimizers


def _refuse_shared(nets: Mapping[str, nn.Module]) -> None:
    """A module (or trainable parameter) registered under two names is refused: each phase freezes the other
    networks' parameters, so the shared ones would be frozen in their own network's phase too."""
    owners: dict[int, str] = {}
    modules: dict[int, str] = {}
    for name, net in nets.items():
        if id(net) in modules:
            raise PreflightError(
                f"network {name!r} is {modules[id(net)]} itself (the same module, registered twice): register each "
                f"network once; phases reach G and D by their names ('G', 'D'), so remove {name!r} from "
                "extra_networks")
        modules[id(net)] = repr(name) if name not in ("G", "D") else name
        for key, param in net.named_parameters():
            if not param.requires_grad:
                continue
            other = owners.setdefault(id(param), name)
            if other != name:
                raise PreflightError(
                    f"network {name!r} shares the trainable parameter {key!r} with network {other!r} (a sub-module "
                    "of it?): each phase freezes the other networks, so a shared parameter would be frozen in its "
                    "own network's phase: give each network its own layers (a phase's loss may call any network "
                    "through ctx.nets, so one network need not hold another)")


def prepare_run(accelerator: Accelerator, config: TrainConfig, plan: PhasePlan, nets: dict[str, nn.Module],
                optimizers: dict[str, Any], schedulers: Mapping[str, Any], multipliers: Mapping[str, Any],
                dataloader: Any) -> Prepared:
    """Fill in default optimizers (fused Adam with the config's lr and betas; extras use G's) and schedulers
    (warmup then the config's schedule, counted in the network's own updates; constant for extras), then
    prepare everything in one call, with the speed options applied around it."""
    bound_waits(config.collective_timeout)  # also for an Accelerator the user built
    check_speed_options(accelerator, config, plan)
    keep_freed_memory(config, accelerator.print)
    apply_memory_format(nets, config)
    ticks = scheduler_ticks_per_optimizer_step(accelerator)
    optimizers, built, ramped = dict(optimizers), {}, []
    fused = accelerator.device.type in ("cpu", "cuda")  # where torch has the fused Adam kernel
    from_config = {name for name in nets if optimizers[name] is None and schedulers.get(name) is None
                   and multipliers.get(name) is None}
    for name, net in nets.items():
        if optimizers[name] is None:
            lr, betas = (config.lr_D, config.betas_D) if name == "D" else (config.lr_G, config.betas_G)
            if isinstance(lr, Ramp) and schedulers.get(name) is not None:
                raise PreflightError(f"lr_{name} is a Ramp, which moves the base rate of gan_accel's scheduler: "
                                     f"pass lr_multiplier_{name} instead of sched_{name}, or a number as lr_{name}")
            # fused: one kernel per step (about 4x faster than the default foreach Adam on CPU), and the
            # divergence guard can skip its update on the device (engine/guard.py)
            optimizers[name] = torch.optim.Adam(net.parameters(), lr=first_value(lr), fused=fused or None,
                                                betas=tuple(first_value(beta) for beta in betas))
            ramped.append(name)
        total = max(1, plan.scheduler_steps(name, config.max_steps))
        schedule = config.lr_schedule if name in ("G", "D") else "constant"
        built[name] = _scheduler(schedulers.get(name), multipliers.get(name), optimizers[name], total, ticks, name,
                                 schedule, config.warmup_ratio)
    names = list(nets)
    # The one prepare: Accelerate wraps the networks (DDP), places everything on its device and shards
    # the dataloader. Nothing in gan_accel calls .to(device) on a model.
    prepared = accelerator.prepare(*nets.values(), *(optimizers[n] for n in names), *(built[n] for n in names),
                                   dataloader)
    n = len(names)
    networks, opts, scheds = (dict(zip(names, prepared[i * n:(i + 1) * n])) for i in range(3))
    return Prepared(networks, opts, scheds, prepared[-1], frozenset(from_config), training_views(networks, config),
                    StepRamps(config, accelerator.num_processes, opts, scheds, ramped))


def _scheduler(sched: Any, multiplier: LRMultiplier | None, optimizer: Any, total_steps: int, ticks: int, name: str,
               schedule: str, warmup_ratio: float) -> Any:
    if sched is not None:
        if multiplier is not None:
            raise ValueError(f"pass either sched_{name} or lr_multiplier_{name}, not both")
        if ticks > 1:
            raise ValueError(
                f"sched_{name} would be stepped {ticks} times per optimizer step by Accelerate on "
                f"{ticks} processes, shortening its schedule: pass lr_multiplier_{name}=<function of "
                "the optimizer step> instead, or an Accelerator with step_scheduler_with_optimizer=False"
            )
        return sched
    if multiplier is None:
        multiplier = warmup_then_decay(total_steps, int(warmup_ratio * total_steps), schedule)
    return lambda_scheduler(optimizer, multiplier, ticks)
