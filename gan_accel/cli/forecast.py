"""``gan-accel train`` on a CPU: how long the run will take, measured before it starts, and what is faster.

A few training steps of the run's model at its batch size are timed on throwaway networks
(:func:`gan_accel.engine.step_timing.time_steps`, a few seconds; the run itself is unchanged, bit for
bit). A run expected to take over :data:`SAY_ABOVE` gets one line with that time; shorter runs say nothing
here, since the progress line measures them after their first ten seconds anyway. Over :data:`ALTERNATIVES_ABOVE`
a second line lists what is faster, each timed the same way where it can be: a smaller ``--resolution``, a
``--max-time`` of an hour, a GPU (not measured: none is here).

On a GPU nothing is timed: its first steps choose kernels and are not representative, and the progress line
gives the measured time within seconds. A resumed run is not timed either (its step is known only once it
opens); its progress line says what is left.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable

from ..config import TrainConfig
from ..models import build_models, default_spec, supported_resolutions
from ..recipes import default_recipe, family_for
from ..text import describe_duration, time_limit_clause

SAY_ABOVE = 15 * 60.0  # seconds: a wait worth knowing before it starts (and a coffee's worth below)
ALTERNATIVES_ABOVE = 3600.0  # seconds: a run of hours, where something faster is worth naming
SMALLER_SIDE = 32  # the size the CPU recipe was measured at
LIMIT = 3600.0  # the --max-time offered


def say_run_time(args: argparse.Namespace, spec: dict[str, Any], overrides: dict[str, Any], config: TrainConfig,
                 on_cpu: bool, log: Callable[[str], Any], always: bool = False) -> None:
    """On a CPU and a new run: time the run's step (``spec``'s networks; ``overrides``: the model flags given), and
    say how long the run will take when that is long (``always``: also when it is short, or why it is not timed:
    a dry run)."""
    from ..engine.step_timing import time_steps

    if not on_cpu or args.resume is not None:
        if always:
            why = "a GPU's first steps choose kernels" if not on_cpu else "a resume's step is known once it opens"
            log(f"gan_accel: expected time: not timed ({why}); the progress line measures it within seconds")
        return
    seconds = time_steps(*throwaway_models(spec), config).seconds
    smaller = None
    if seconds * config.max_steps > ALTERNATIVES_ABOVE and spec["image_size"] > SMALLER_SIDE:
        small_spec = smaller_spec(args, overrides, spec)
        if small_spec is not None:
            small_config = dataclasses.replace(config, model=small_spec, z_dim=small_spec["z_dim"])
            smaller = (SMALLER_SIDE, time_steps(*throwaway_models(small_spec), small_config, budget=1.0).seconds)
    warmup = config.warmup_ratio * config.max_steps
    lines = run_time_lines(config.max_steps, seconds, config.max_time, smaller, warmup)
    for line in lines or ([expected_line(config.max_steps, seconds, config.max_time, warmup)] if always else []):
        log(f"gan_accel: {line}")


def throwaway_models(spec: dict[str, Any]) -> tuple[Any, Any]:
    """G and D of ``spec`` for timing only, built without drawing from the run's random stream."""
    import torch

    with torch.random.fork_rng(devices=[]):
        return build_models(spec)


def smaller_spec(args: argparse.Namespace, overrides: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
    """The networks the same command trains with ``--resolution 32`` (None when its family makes no 32 px):
    ``overrides`` are the model flags given."""
    family = args.model or family_for(SMALLER_SIDE, gpu=False)
    if SMALLER_SIDE not in supported_resolutions(family):
        return None
    recipe = default_recipe(SMALLER_SIDE, 1)
    width = overrides.get("width") or (recipe.width if family == recipe.model else None)
    return default_spec(family, SMALLER_SIDE, spec["channels"], spec.get("num_classes"),
                        **{**overrides, **({"width": width} if width else {})})


def run_time_lines(steps: int, seconds: float, max_time: float | None,
                   smaller: tuple[int, float] | None = None, warmup_steps: float = 0.0) -> list[str]:
    """What to say about a run of ``steps`` steps of ``seconds`` each (none when short; the time limit's stop;
    over an hour, what is faster: ``smaller`` is (side, seconds per step) of a smaller resolution)."""
    total = steps * seconds
    if total <= SAY_ABOVE:
        return []
    line = expected_line(steps, seconds, max_time, warmup_steps)
    if total <= ALTERNATIVES_ABOVE:
        return [line]
    faster = []
    if smaller is not None:
        faster.append(f"--resolution {smaller[0]} (about {describe_duration(steps * smaller[1])}, timed the same way)")
    if max_time is None and seconds < LIMIT:
        faster.append(f"--max-time 1h (about {about(LIMIT / seconds):,} of the {steps:,} steps)")
    faster.append("a GPU (typically much faster; not measured here)")
    return [line, "faster: " + ", ".join(faster[:-1]) + (", or " if len(faster) > 1 else "") + faster[-1]]


def expected_line(steps: int, seconds: float, max_time: float | None, warmup_steps: float = 0.0) -> str:
    """The run's expected time: ``steps`` of ``seconds`` each, and where the time limit stops it (and whether
    inside the warmup of the first ``warmup_steps``)."""
    total = steps * seconds
    step = f"{seconds:.2g} s" if seconds < 10 else describe_duration(seconds)  # 0.12 s, 2.6 s, 14 s
    line = (f"expected time: about {describe_duration(total)} on this machine ({steps:,} steps at {step} each, timed "
            "just now on a few steps of this model)")
    if max_time is not None and max_time < total:
        line += time_limit_clause(max_time, about(max(1, max_time / seconds)), warmup_steps)
    return line


def about(count: float) -> int:
    """A step count as measured, to two significant figures: ``1,597.3`` -> 1,600; ``8.4`` -> 8."""
    whole = int(count)
    return whole if whole < 100 else round(whole, 2 - len(str(whole)))
