"""How long one training step takes on this machine, measured before a run starts, on networks of its own.

The step timed is the engine's: the phases of :func:`~gan_accel.engine.phases.default_phases` (D, the lazy
R1/R2 penalties at their share of the steps, G) with the run's loss and augmentation, G's samples made once
for D and G as the runner makes them, Adam updates. It runs on networks the caller builds for the purpose and
throws away, under :func:`torch.random.fork_rng`: the run's random streams, networks and optimizers are never
touched, so a run that measured first is bitwise the run that did not.

A large step takes seconds on a CPU, so the timing keeps to a budget: a batch too slow for it is timed on
fewer images and extrapolated (:func:`time_steps`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from ..augment import build_augment
from ..config import TrainConfig
from .context import MicroBatch, StepContext, frozen
from .phases import GENERATOR, default_phases
from .schedules import first_value
from .speed import apply_memory_format

FIRST_BATCH = 4  # the smallest batch timed: a run whose batch is too slow for the budget is timed on fewer images
MAX_REPEATS = 20  # timed steps at one batch size at most (a tiny network's steps are noisy one by one)
FULL_STEP_SECONDS = 2.5  # one step of the run's batch is timed when the small ones say it takes at most this
REFINE_SECONDS = 0.5  # at most this much of the budget goes to timing the largest batch again


@dataclass(frozen=True)
class StepTiming:
    """Seconds per training step at the run's batch, and how they were measured."""

    seconds: float  # one pass over the phase list at the run's batch size x accumulation
    measured_batch: int  # the most images per step that were timed (extrapolated to the run's when fewer)
    seconds_spent: float  # what measuring took


def time_steps(G: nn.Module, D: nn.Module, config: TrainConfig, budget: float = 2.0) -> StepTiming:
    """Time the engine's step of ``G`` and ``D`` (throwaway networks: they are trained) at ``config.batch_size``
    x ``grad_accum_steps`` images: about ``budget`` seconds, plus one step of the run's batch when that is
    expected to take under :data:`FULL_STEP_SECONDS` (more only when four small steps take more).

    Steps of 4 and 8 images come first. A CPU step has a cost per image and a cost per step (per layer, more so
    with several threads on a busy machine), and the cost per image itself changes with the batch (caches), so
    the run's own batch is timed where one step of it is short; else the batch doubles while the next step fits
    the budget, and a line through the two largest sizes gives the run's."""
    batch = config.batch_size * config.grad_accum_steps
    with torch.random.fork_rng(devices=[]):  # the run's CPU stream is put back as it was
        torch.manual_seed(0)
        loop, start = _StepLoop(G, D, config), time.perf_counter()
        sizes = [min(batch, FIRST_BATCH)]
        # The first step, with the lazy penalties: it also allocates memory and chooses kernels, so it
        # overstates the penalties' step a little (which counts once in lazy_every steps).
        lazy = _timed(loop, sizes[0], 1, lazy=True)
        times = [_timed(loop, sizes[0], 1)]
        if sizes[0] < batch:
            sizes.append(min(2 * sizes[0], batch))
            times.append(_timed(loop, sizes[-1], 1))
        if sizes[-1] < batch and _extrapolate(sizes, times, batch) <= FULL_STEP_SECONDS:
            sizes.append(batch)
            times.append(_timed(loop, batch, 1))
        while sizes[-1] < batch:
            size = min(2 * sizes[-1], batch)
            if time.perf_counter() - start + times[-1] * size / sizes[-1] > budget:
                break
            sizes.append(size)
            times.append(_timed(loop, size, 1))
        # the first step of the largest size allocated too: time it again, as often as the budget allows
        left = min(budget - (time.perf_counter() - start), REFINE_SECONDS)
        repeats = max(0, min(MAX_REPEATS, int(left / times[-1])))
        if repeats:
            times[-1] = _timed(loop, sizes[-1], repeats)
        plain = _extrapolate(sizes, times, batch)
        if loop.lazy_every > 1:  # the penalties' extra, timed on the smallest batch, grows as the step does
            plain += max(lazy - times[0], 0.0) * plain / times[0] / loop.lazy_every
        return StepTiming(plain, sizes[-1], time.perf_counter() - start)


def _extrapolate(sizes: list[int], times: list[float], batch: int) -> float:
    """Seconds per step at ``batch`` images from those timed at ``sizes``: the largest itself, else a line through
    the two largest (bounded by proportional scaling above and by the largest time below), else in proportion."""
    if sizes[-1] == batch:
        return times[-1]
    proportional = times[-1] * batch / sizes[-1]
    if len(sizes) < 2:
        return proportional
    per_image = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
    return min(max(times[-1] + per_image * (batch - sizes[-1]), times[-1]), proportional)


def _timed(loop: "_StepLoop", batch: int, count: int, lazy: bool = False) -> float:
    """Mean seconds of ``count`` steps on ``batch`` images (with the lazy penalties when ``lazy``)."""
    start = time.perf_counter()
    for _ in range(count):
        loop(batch, lazy)
    return (time.perf_counter() - start) / count


class _StepLoop:
    """The runner's step without Accelerate (one process, one window of the whole batch): the same phases,
    losses and updates, on plain modules and random images; ``loop(batch, lazy)`` runs one step."""

    def __init__(self, G: nn.Module, D: nn.Module, config: TrainConfig) -> None:
        self.nets = {"G": G.train(), "D": D.train()}
        apply_memory_format(self.nets, config)
        self.config = config
        self.optimizers = {name: torch.optim.Adam(net.parameters(), betas=tuple(first_value(b) for b in betas))
                           for (name, net), betas in zip(self.nets.items(), (config.betas_G, config.betas_D))}
        self.phases = default_phases(config)
        self.lazy_every = max(phase.every for phase in self.phases)
        augment = None if config.augment == "none" else build_augment(
            config.augment, **({} if config.augment_p is None else {"p": first_value(config.augment_p)}))
        self.updates = {"G": 0, "D": 0}
        self.ctx = StepContext(self.nets, conditional=config.num_classes is not None, updates=self.updates,
                               augment=augment)
        spec = config.model or {}
        self.shape = (spec.get("channels", 3), spec.get("image_size", 32), spec.get("image_size", 32))

    def __call__(self, batch: int, lazy: bool = False) -> None:
        classes = self.config.num_classes
        labels = None if classes is None else torch.randint(classes, (batch,))
        micro = MicroBatch(torch.rand(batch, *self.shape) * 2 - 1, labels, torch.randn(batch, self.config.z_dim),
                           labels)
        # G's samples once, with their graph, for D's phase and G's (the runner's hoist)
        micro.fake, micro.fake_version, micro.fake_has_graph = self.ctx.generate(micro.latents, labels), \
            self.updates[GENERATOR], True
        self.ctx.micro = micro
        for phase in (p for p in self.phases if lazy or p.every == 1):
            self.ctx.phase = phase
            with frozen(p for name, net in self.nets.items() if name != phase.net for p in net.parameters()):
                # A bare backward on purpose: a throwaway fp32 copy timed on the CPU, outside Accelerate (no loss
                # scaling or accumulation to honour); the run itself goes through accelerator.backward.
                (phase.loss(self.ctx) * phase.gain).backward()
            self.optimizers[phase.net].step()
            self.optimizers[phase.net].zero_grad(set_to_none=True)
            self.updates[phase.net] += 1
