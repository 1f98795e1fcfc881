"""The training step: runs the due phases of one step under Accelerate's rules.

This is the only code that knows those rules, so every phase, built in or yours, inherits them:

* **One accumulation window per phase run**: ``accelerator.accumulate(net)`` exactly ``grad_accum_steps``
  times, so Accelerate's one counter per process ends every phase run on the sync micro-batch. Only the
  trained network is passed; the others are frozen (``requires_grad_(False)``) and under ``no_sync``, so
  their DDP reducers never wait for a gradient that will not come.
* **Autocast around the loss, ``accelerator.backward``** (fp16 scaling, the 1/k of accumulation), times the gain.
* **After the window**: the guard's device verdict, clipping of this network only (under fp16 only its
  optimizer is unscaled), ``step`` or its skip, the scheduler, then ``zero_grad`` (after ``step``: a leading
  one would wipe the accumulated micro-batches).
* **G forward once**: without accumulation, when a G phase follows a D phase in the same window, G's
  samples are made once with their graph before D's phase (as pytorch/examples' DCGAN does).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator, Mapping

import torch
from accelerate import Accelerator
from torch import nn

from ..errors import PhaseError
from ..batch import RealBatch
from .augmentation import RunAugmentation
from .conditioning import Conditioning
from .context import MicroBatch, StepContext, frozen
from .guard import BufferRestore, DivergenceGuard, Fp16Skips, SkipStep, inner_optimizer
from .latents import LatentSampler
from .phases import GENERATOR, Phase, PhasePlan
from .running_means import RunningMeans
from .schedules import StepRamps, scheduler_stepper


class PhaseRunner:
    """Runs the phases of each step. Holds the current window and the per-network counters."""

    def __init__(self, accelerator: Accelerator, nets: Mapping[str, nn.Module], optimizers: Mapping[str, Any],
                 schedulers: Mapping[str, Any], plan: PhasePlan, sample_latents: LatentSampler,
                 means: RunningMeans, *, clip_norms: Mapping[str, float | None], guard: DivergenceGuard | None,
                 conditioning: Conditioning = Conditioning(), augmentation: RunAugmentation | None = None,
                 ramps: StepRamps | None = None) -> None:
        self.accelerator = accelerator
        self.nets, self.optimizers, self.schedulers = dict(nets), dict(optimizers), dict(schedulers)
        self.plan = plan
        self.sample_latents = sample_latents
        self.conditioning = conditioning
        self.means = means
        self.clip_norms = dict(clip_norms)
        self.guard = guard
        self.skippable = SkipStep(accelerator.scaler)  # how a flagged update is skipped on the device
        self.fp16_skips = Fp16Skips(accelerator.scaler, nets)  # the updates the fp16 scaler skipped
        # A skipped update puts the networks' buffers back too (BatchNorm statistics); only with the guard.
        self.buffers = BufferRestore(self.nets if guard is not None else {})
        self._steppers = {name: direct_stepper(accelerator, opt) for name, opt in self.optimizers.items()}
        self._tickers = {name: scheduler_stepper(accelerator, sched) for name, sched in self.schedulers.items()}
        # Accelerate's autocast() is a nullcontext without mixed precision, after a generator-based
        # context manager and a state lookup per entry: skip those where they do nothing.
        self._autocast = accelerator.autocast if accelerator.native_amp else contextlib.nullcontext
        self.k = accelerator.gradient_accumulation_steps
        self._distributed = accelerator.use_distributed
        self.updates = {name: 0 for name in self.nets}  # optimizer updates of each network (version of G's samples)
        self.phase_runs: dict[str, int] = {phase.name: 0 for phase in plan.phases}
        self.lr_used: dict[str, float] = {}
        self.images_seen = 0  # real samples drawn, on this process
        self.measure_grad_norm = False  # set by the trainer for the step that ends a log interval
        # The parameters each network trains: freezing a network touches only these, so a user's own
        # frozen sub-module stays frozen when the network is unfrozen again.
        self._trainable = {name: [p for p in net.parameters() if p.requires_grad] for name, net in self.nets.items()}
        self.augmentation = augmentation  # of every image D sees (engine/augmentation.py)
        self.ramps = ramps  # the config's Ramps, set before each step from the images seen (engine/schedules.py)
        self.ctx = StepContext(self.nets, conditional=conditioning.conditional, log=means.add,
                               scaler=accelerator.scaler, updates=self.updates,
                               augment=augmentation.augment if augmentation is not None else None,
                               observe_real=augmentation.observe_real if augmentation is not None else None)
        self.batches: Iterator[RealBatch] | None = None
        self.window: list[MicroBatch] = []

    # -- one step -------------------------------------------------------------------------------
    def run_step(self, on_phase_end: Callable[[Phase], None]) -> None:
        """Run every phase due in this step, in list order; ``on_phase_end(phase)`` after each."""
        due = self.plan.advance()
        if self.ramps is not None:
            self.ctx.images = self.ramps.apply(self.ctx.step)
            if self.augmentation is not None:
                self.augmentation.start_step(self.ctx.images)
        for index, phase in enumerate(due):
            keep_graph = phase.new_data and self.k == 1 and phase.net != GENERATOR and _G_follows(due, index)
            self._run_phase(phase, keep_graph)
            on_phase_end(phase)
        if self.augmentation is not None:
            self.augmentation.end_step()  # ADA: p moves every ada_interval steps, on every process alike

    def _run_phase(self, phase: Phase, keep_graph: bool) -> None:
        acc = self.accelerator
        net, optimizer = self.nets[phase.net], self.optimizers[phase.net]
        if phase.new_data:
            self.buffers.save_hoisted(keep_graph)
            self.window = [self._draw_micro_batch(keep_graph)]  # the rest are drawn as they are needed
        elif not self.window:
            raise PhaseError(f"phase {phase.name!r} reuses the current window, but no phase has drawn data yet")
        self.buffers.save(uses_hoisted_forward=phase.net == GENERATOR)
        self.ctx.phase = phase
        total = None
        others = [name for name in self.nets if name != phase.net]
        with contextlib.ExitStack() as stack:
            # Frozen: their DDP reducers must not expect gradients. (One process: Accelerate's no_sync
            # is a nullcontext there, and entering it costs ~5 us a network.)
            stack.enter_context(frozen(p for name in others for p in self._trainable[name]))
            for name in others if self._distributed else ():
                stack.enter_context(acc.no_sync(self.nets[name]))
            for index in range(self.k):
                if index == len(self.window):
                    self.window.append(self._draw_micro_batch(False))
                self.ctx.micro = self.window[index]
                with acc.accumulate(net):
                    with self._autocast():
                        loss = phase.loss(self.ctx)
                    self.accelerator.backward(loss if phase.gain == 1.0 else loss * phase.gain)
                loss = loss.detach()
                total = loss if total is None else total + loss
                self.means.add(f"loss/{phase.name}", loss)
        self._update(phase, net, optimizer, total)

    def _update(self, phase: Phase, net: nn.Module, optimizer: Any, window_loss: torch.Tensor) -> None:
        """Verdict, clip, step or skip, tick, zero_grad: the window ended on the sync micro-batch."""
        name = phase.net
        skip = self._verdict(name, optimizer, window_loss, phase.new_data)
        max_norm = self.clip_norms.get(name)
        if max_norm is not None:
            # fp16: the GradScaler is shared by all optimizers; unscale only this network's
            # gradients (accelerator.clip_grad_norm_ would unscale every optimizer).
            self.accelerator.unscale_gradients(optimizer=optimizer)
            self._log_grad_norm(name, torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm), skip)
        elif self.measure_grad_norm:  # the log interval's last step only: foreach norms on the device, no host read
            norm = torch.nn.utils.get_total_norm([p.grad for p in self._trainable[name] if p.grad is not None])
            scale = None if self.accelerator.scaler is None else self.accelerator.scaler._get_scale_async()
            self._log_grad_norm(name, norm if scale is None else norm / scale, skip)  # fp16: still scaled here
        if phase.tick_scheduler:  # this step's lr, before the scheduler moves it
            self.lr_used[f"lr/{name}"] = optimizer.param_groups[0]["lr"]
        stepper = self._steppers[name]
        scale_before = self.fp16_skips.before()
        if skip is None:
            stepper.step()
        else:  # skipped on the device where the verdict is set, and the buffers the forwards changed put back
            self.skippable.step(stepper, skip)
            self.buffers.restore_where(skip)
        self.fp16_skips.after(name, scale_before)
        if phase.tick_scheduler:
            self._tickers[name]()  # a skipped update (guard or fp16 overflow) still uses up its step of the schedule
        stepper.zero_grad(set_to_none=True)
        self.updates[name] += 1
        self.phase_runs[phase.name] += 1

    def _log_grad_norm(self, name: str, norm: torch.Tensor, skip: torch.Tensor | None) -> None:
        """``grad_norm/<net>`` of the kept updates: a skipped one's non-finite norm must not make the mean inf/NaN."""
        keep = torch.isfinite(norm) if skip is None else torch.isfinite(norm) & (skip == 0)
        self.means.add(f"grad_norm/{name}", norm, keep=keep)

    def _verdict(self, name: str, optimizer: Any, window_loss: torch.Tensor, new_data: bool) -> torch.Tensor | None:
        """The divergence guard's verdict on this update (1.0 = skip, no host sync), or None without the guard."""
        if self.guard is None:
            return None
        # With an fp16 GradScaler, inf/NaN gradients are the scaler's business (it skips those steps).
        grads = [p.grad for p in self._trainable[name] if p.grad is not None] if self.accelerator.scaler is None else []
        skip = self.guard.verdict(name, window_loss, grads, [micro.real for micro in self.window] if new_data else ())
        self.skippable.mark_gradients(optimizer, skip)  # fp16: the scaler will see it
        return skip

    # -- data -----------------------------------------------------------------------------------
    def _draw_micro_batch(self, keep_graph: bool) -> MicroBatch:
        """The next real batch and fresh latents (and, with ``keep_graph``, G's samples with their graph)."""
        device = self.accelerator.device
        real, labels = next(self.batches)
        self.images_seen += real.shape[0]
        latents = self.sample_latents(real.shape[0], device)
        fake_labels = self.conditioning.fake_labels(real.shape[0], device, labels)
        micro = MicroBatch(real, labels, latents, fake_labels)
        if keep_graph:
            # Part of G's coming phase, hoisted: made while G is trainable and outside no_sync(G), so
            # the G phase's backward all-reduces G's gradients as usual.
            with self._autocast():
                micro.fake = self.ctx.generate(latents, fake_labels)
            micro.fake_version, micro.fake_has_graph = self.updates[GENERATOR], True
        return micro

    # -- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.state_dict(), "updates": dict(self.updates), "phase_runs": dict(self.phase_runs),
                "lr_used": dict(self.lr_used), "images_seen": self.images_seen,
                "augment": self.augmentation.state_dict() if self.augmentation is not None else None,
                "fp16_skips": self.fp16_skips.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plan.load_state_dict(state["plan"])
        self.updates.update(state["updates"])
        self.phase_runs.update(state["phase_runs"])
        self.lr_used = dict(state["lr_used"])
        self.images_seen = int(state["images_seen"])
        if self.augmentation is not None:
            self.augmentation.load_state_dict(state.get("augment"))
        self.fp16_skips.load_state_dict(state.get("fp16_skips"))


def direct_stepper(accelerator: Any, optimizer: Any) -> Any:
    """What the runner calls ``step()``/``zero_grad()`` on: the torch optimizer itself where Accelerate's
    wrapper adds nothing but cost (at a window's end without fp16 or XLA it just calls the inner ``step()``,
    after package lookups of ~0.5 ms each on a 2-core CPU, a quarter of a small GAN's step), else the wrapper.
    """
    from accelerate.utils import DistributedType

    inner = inner_optimizer(optimizer)
    if inner is optimizer or accelerator.scaler is not None or accelerator.distributed_type == DistributedType.XLA:
        return optimizer
    try:
        accepts_set_to_none = "set_to_none" in inspect.signature(inner.zero_grad).parameters
    except (TypeError, ValueError):
        accepts_set_to_none = False
    return inner if accepts_set_to_none else optimizer


def _G_follows(due: list[Phase], index: int) -> bool:
    """Whether a phase training G comes after ``due[index]`` in the same window, before G changes."""
    for phase in due[index + 1:]:
        if phase.new_data:
            return False
        if phase.net == GENERATOR:
            return True
    return False
