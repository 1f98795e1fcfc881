"""GANTrainer: builds the run (one ``prepare``), then loops over steps and fires the callbacks' events.

The loop, in one place (``fit``)::

    for each step until max_steps:
        runner.run_step()          the due phases, each under Accelerate's rules (engine/runner.py)
        on_step_end                callbacks (EMA, progress, signals, yours)
        on_log / on_sample / on_checkpoint, when due
    on_checkpoint, on_fit_end, on_close

What a step does is data (the phase list, engine/phases.py); what happens around it is callbacks
(gan_accel/callbacks/). The trainer owns the run's state (``state``, a :class:`RunState`), the data
stream, the metric reduction and the checkpoint state; callbacks read ``state`` and ask for changes
through ``control`` (engine/control.py), which the trainer applies in :meth:`GANTrainer._apply`.

Counting, in one vocabulary (everything is checkpointed):

* ``step``: passes over the phase list (one G update each with the default list); intervals count it;
* ``d_step``: updates of the phase named "D"; ``runner.phase_runs[phase]``: runs of each phase;
* ``runner.updates[net]``: optimizer updates of each network (also the version of G's cached samples);
* ``runner.plan.occurrences[phase]``: times a phase came up in the list, run or not (``every`` counts these);
* ``images_seen``: real samples drawn on this process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader

from ..callbacks import BUILTIN_CALLBACKS, CallbackList, default_callbacks
from ..callbacks.base import assemble
from ..config import TrainConfig
from ..ending import TIME_LIMIT
from ..errors import GanAccelError, TrainingInterrupted
from ..processes import run_together
from ..storage.lock import RunLock
from ..text import describe_duration
from .augmentation import RunAugmentation
from .build import ExtraNetwork, collect_networks, prepare_run
from .conditioning import conditioning_for
from .control import Control, RunState
from .data_stream import DataStream
from .guard import DivergenceGuard
from .latents import LabelSampler, LatentSampler, draw_fixed_latents, gaussian_latents, generate_samples, map_tensors
from .launch import build_accelerator, check_accelerator, check_launch
from .phases import Phase, PhasePlan, default_phases
from .preflight import check_dataloader, dry_run
from .run_open import open_run, resume_note
from .runner import PhaseRunner
from .running_means import RunningMeans
from .schedules import LRMultiplier
from .snapshot import restore_snapshot, take_snapshot


def loss_scale(accelerator: Accelerator) -> dict[str, float]:
    """``{"loss_scale": s}`` with an fp16 GradScaler (a host read: at log rows only), else ``{}``."""
    return {} if accelerator.scaler is None else {"loss_scale": float(accelerator.scaler.get_scale())}


def _entry(table: str, name: str) -> property:
    """A read-only view of one entry of a trainer's table: ``trainer.G`` is ``trainer.networks["G"]``."""
    return property(lambda self: getattr(self, table)[name], doc=f"``self.{table}[{name!r}]``")


class GANTrainer:
    """Trains a generator ``G`` and a discriminator ``D`` (and any extra networks) on Accelerate.

    Args:
        G: maps latents (from ``latent_sampler``) to samples shaped like the real data.
        D: maps samples to one logit per sample.
        train_dataloader: yields real samples (see :func:`~gan_accel.batch.split_batch`); map-style
            or ``IterableDataset``.
        config: the run's :class:`TrainConfig`.
        accelerator: built from ``config`` when omitted (see :func:`~gan_accel.engine.launch.build_accelerator`).
        opt_G, opt_D: default to Adam with the config's learning rates and betas.
        sched_G, sched_D: default to linear warmup then decay, counted in optimizer steps. A scheduler
            you pass must not be multiplied by Accelerate's per-process stepping: on several processes
            pass ``lr_multiplier_G``/``lr_multiplier_D`` (a function of the optimizer step) instead.
        lr_multiplier_G, lr_multiplier_D: custom schedules, as multipliers of the base lr by step.
        latent_sampler: ``(batch_size, device) -> latents``; defaults to ``randn(batch_size, z_dim)``.
            It also draws the fixed latents of the progress samples.
        phases: the phase list of one step; defaults to :func:`~gan_accel.engine.phases.default_phases`.
        extra_networks: more networks that phases may train, ``{"E": module}`` (Adam with ``lr_G``) or
            ``{"E": (module, optimizer)}``; prepared with the rest, checkpointed, constant lr after warmup.
        callbacks: added after the built-in ones; one named like a built-in replaces it.
        disable_callbacks: names of built-in callbacks to switch off (e.g. ``("sample_saver", "progress_bar")``).
    """

    def __init__(self, G: nn.Module, D: nn.Module, train_dataloader: DataLoader, config: TrainConfig, *,
                 accelerator: Accelerator | None = None, opt_G: torch.optim.Optimizer | None = None,
                 opt_D: torch.optim.Optimizer | None = None, sched_G: Any = None, sched_D: Any = None,
                 lr_multiplier_G: LRMultiplier | None = None, lr_multiplier_D: LRMultiplier | None = None,
                 latent_sampler: LatentSampler | None = None, label_sampler: LabelSampler | None = None,
                 phases: Sequence[Phase] | None = None,
                 extra_networks: Mapping[str, ExtraNetwork] | None = None, callbacks: Iterable[Any] = (),
                 disable_callbacks: Iterable[str] = ()) -> None:
        config.validate()
        self.config = config
        if accelerator is None:
            accelerator = build_accelerator(config)  # checks the launch itself
        else:
            check_launch(accelerator)
            check_accelerator(accelerator, config)
        self.accelerator = accelerator
        self.output_dir = Path(config.output_dir)
        self.sample_latents = latent_sampler or gaussian_latents(config.z_dim)
        self.conditioning = conditioning_for(config, label_sampler)
        nets, optimizers = collect_networks(G, D, opt_G, opt_D, extra_networks)
        plan = PhasePlan(phases if phases is not None else default_phases(config), nets)

        # Preflight on the raw modules and loader: a wrong shape, batch form or phase costs seconds, not a run.
        check_dataloader(train_dataloader, config.batch_size)
        # the first batch's real samples (and labels): the diversity's yardstick and D's probe (callbacks/health.py)
        self.reference_samples, self.reference_labels = dry_run(nets, plan, train_dataloader, self.sample_latents,
                                         conditioning=self.conditioning, num_reference=max(config.num_samples, 256),
                                         warn=accelerator.is_main_process)
        self.fixed_latents, self.fixed_labels = self.conditioning.draw_fixed(self.sample_latents, config)
        prepared = prepare_run(accelerator, config, plan, nets, optimizers, {"G": sched_G, "D": sched_D},
                               {"G": lr_multiplier_G, "D": lr_multiplier_D}, train_dataloader)
        self.networks, self.optimizers, self.schedulers = prepared.networks, prepared.optimizers, prepared.schedulers
        self.train_dataloader = prepared.dataloader
        self.built_from_config = prepared.built  # the optimizers and schedulers a resume may re-rate
        # Seeded after prepare: the data order must be the same on every process (see build_accelerator),
        # the noise different on each (the same noise everywhere would waste the larger batch).
        set_seed(config.seed, device_specific=True)

        self.state, self.control = RunState(), Control()
        self.data = DataStream(self.train_dataloader, accelerator)
        self.means = RunningMeans()
        self.guard = DivergenceGuard(config.max_bad_updates, tuple(nets), accelerator.print,
                                     resume_note=self.checkpoint_note) if config.nan_guard else None
        self.runner = PhaseRunner(accelerator, prepared.train_networks, self.optimizers, self.schedulers, plan,
                                  self.sample_latents, self.means, guard=self.guard, conditioning=self.conditioning,
                                  clip_norms={"G": config.clip_grad_norm_G, "D": config.clip_grad_norm_D},
                                  augmentation=RunAugmentation(config, accelerator), ramps=prepared.ramps)
        self.last_metrics: dict[str, float] = {}
        self._next_row: dict[str, Any] = {}  # values the callbacks logged for the next metrics row
        self.lock = RunLock(self.output_dir)  # held by the main process while fit runs
        self.fit_calls = 0
        self.callbacks = CallbackList(assemble(default_callbacks(config), callbacks, disable_callbacks,
                                               BUILTIN_CALLBACKS))
        self.callbacks.bind(self, after_each=self._apply)

    # -- the loop -----------------------------------------------------------------------------
    def fit(self, resume_from: str | Path | None = None, stop_at_step: int | None = None) -> dict[str, float]:
        """Train until ``config.max_steps`` steps; returns the last logged metrics.

        A new run needs an absent or empty ``output_dir``, or one whose run was killed before its first checkpoint.
        ``resume_from``: ``"latest"`` continues the run in ``output_dir`` exactly where it was saved (same batches,
        noise and metrics); ``"auto"`` does that when ``output_dir`` holds a complete checkpoint, else starts a new
        run there (a requeue); any other checkpoint starts a new run from it (a fork) where a new run may start.
        ``stop_at_step``: checkpoint and return early at that step (the schedules still run to ``max_steps``); a later
        ``fit()`` continues. SIGINT/SIGTERM: the step finishes, a checkpoint is written, :class:`TrainingInterrupted`.
        """
        cfg, acc, control = self.config, self.accelerator, self.control
        target = cfg.max_steps if stop_at_step is None else min(stop_at_step, cfg.max_steps)
        try:
            open_run(self, resume_from)
            self.fit_calls += 1
            if acc.mixed_precision == "fp16" and acc.scaler is None:
                acc.print("gan_accel: fp16 was requested but Accelerate runs fp32 on this device (CPU); use bf16 on CPU")
            acc.wait_for_everyone()
            self.runner.batches = iter(self.data)
            self._interval_start = (time.perf_counter(), self.runner.images_seen)
            self.callbacks.fire("on_fit_start")
            while self.step < target:
                self.runner.ctx.step = self.step
                self.runner.measure_grad_norm = (self.step + 1) % cfg.log_every == 0 or self.step + 1 == cfg.max_steps
                self.runner.run_step(lambda phase: self.callbacks.fire("on_phase_end", phase))
                self.state.step += 1
                self.callbacks.fire("on_step_end")
                self._checkpoint_if_asked()
                last = self.step == cfg.max_steps
                if self.step % cfg.log_every == 0 or last:
                    self.log_metrics()
                if self.step % cfg.sample_every == 0 or last:
                    self.fire_agreed("on_sample")
                self._checkpoint_if_asked()
                if control.stop_signal is not None:  # a signal (raises) or the time limit
                    _stop_here(self)
                    break
                if self.step % cfg.checkpoint_every == 0 and self.step < target:
                    self.fire_agreed("on_checkpoint")
            else:
                self.fire_agreed("on_checkpoint")
                if self.step >= cfg.max_steps:
                    self.fire_agreed("on_fit_end")
            acc.wait_for_everyone()
        except BaseException as error:
            _remember(error, self)  # the step and checkpoint the exit line names
            try:
                self.callbacks.fire("on_close")
            except Exception as close_error:  # never hide the error that stopped the run
                acc.print(f"gan_accel: while closing after an error: {close_error}")
            self.lock.release(error)  # a run that did not end as planned leaves its record: it can start again
            raise
        finally:
            self.lock.release()
        self.callbacks.fire("on_close")
        return self.last_metrics

    def fire_agreed(self, event: str, *args: Any) -> None:
        """Fire an event whose handlers write files on the main process: a failure stops every process alike."""
        run_together(self.accelerator, lambda: self.callbacks.fire(event, *args))

    def _checkpoint_if_asked(self) -> None:
        if self.control.checkpoint_requested:  # a callback asked for one at this step (e.g. a new best)
            self.control.checkpoint_requested = False
            self.fire_agreed("on_checkpoint")

    def _apply(self) -> None:
        """Apply what the callback handler that just returned asked through ``self.control``: the one place
        where callbacks change the run (``save_checkpoint`` and ``stop`` are acted on by the loop)."""
        control, state = self.control, self.state
        if control.metrics:
            self._next_row.update(control.metrics)
            control.metrics = {}
        for name, keep in control.keeps:
            (state.kept_checkpoints.add if keep else state.kept_checkpoints.discard)(name)
        control.keeps = []
        if control.written is not None:
            state.last_checkpoint, state.last_checkpoint_step, control.written = control.written, state.step, None

    def log_metrics(self) -> dict[str, Any]:
        """Collective (every rank reduces): the means since the last row, then ``on_log(row)``."""
        acc = self.accelerator
        now, images = time.perf_counter(), self.runner.images_seen
        start_time, start_images = self._interval_start
        self._interval_start = (now, images)
        row: dict[str, Any] = {"step": self.step, "d_step": self.d_step, "epoch": self.data.epoch}
        row.update(self.means.reduce(acc))
        row.update({**self.runner.lr_used, **loss_scale(acc), **self.runner.fp16_skips.metrics(),
                    **self.runner.augmentation.metrics()})
        if self.guard is not None:  # the skip counters live on the device; past max_bad_updates this raises
            row.update(self.guard.check(self.step))
        row["images/s"] = (images - start_images) * acc.num_processes / max(now - start_time, 1e-9)
        row.update(self._next_row)
        self._next_row = {}
        self.last_metrics = row
        self.fire_agreed("on_log", row)
        return row

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state on this process (Accelerate's is saved by ``save_state``)."""
        return take_snapshot(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (this process's), after checking it can continue this run."""
        restore_snapshot(self, state)

    # -- what users and callbacks read; nothing here changes the run (``_apply`` does) -------------
    G = _entry("networks", "G")
    D = _entry("networks", "D")
    opt_G = _entry("optimizers", "G")
    opt_D = _entry("optimizers", "D")
    sched_G = _entry("schedulers", "G")
    sched_D = _entry("schedulers", "D")

    @property
    def step(self) -> int:
        """Steps completed: passes over the phase list (``state.step``)."""
        return self.state.step

    @property
    def epoch(self) -> int:
        """Passes over the training data completed (zero-based index of the current one)."""
        return self.data.epoch

    @property
    def d_step(self) -> int:
        """Discriminator updates of the phase named "D" so far."""
        return self.runner.phase_runs.get("D", 0)

    @property
    def images_seen(self) -> int:
        """Real samples drawn on this process."""
        return self.runner.images_seen

    @property
    def images_per_step(self) -> int:
        """Latents G trains on in one step, over all processes (batch x accumulation x processes)."""
        return self.config.batch_size * self.config.grad_accum_steps * self.accelerator.num_processes

    @property
    def ema(self) -> Any:
        """The EMA of G (None without the ``generator_ema`` callback)."""
        callback = self.callbacks.get("generator_ema")
        return callback.ema if callback is not None else None

    def sampling_generator(self) -> nn.Module:
        """The generator to sample from: the EMA when enabled, else the unwrapped G."""
        callback = self.callbacks.get("generator_ema")
        return callback.module if callback is not None else self.accelerator.unwrap_model(self.G)

    def draw_latents(self, count: int, seed: int, device: torch.device | None = None) -> Any:
        """``count`` latents of the run's sampler from ``seed`` (on CPU, or moved to ``device``): the same on
        every process, and the training noise is not shifted (for evaluation and the EMA's statistics)."""
        latents = draw_fixed_latents(self.sample_latents, count, seed)
        return latents if device is None else map_tensors(latents, lambda t: t.to(device))

    def generate(self, latents: Any = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Samples from :meth:`sampling_generator` in eval mode: the fixed latents (and fixed labels) by
        default; a conditional run needs ``labels`` (class indices) with its own ``latents``."""
        if latents is None:
            latents, labels = self.fixed_latents, self.fixed_labels if labels is None else labels
        if self.conditioning.conditional and labels is None:
            raise ValueError("a conditional run samples G(z, y): pass labels (class indices) with the latents")
        return generate_samples(self.sampling_generator(), latents, self.accelerator,
                                labels if self.conditioning.conditional else None)

    def checkpoint_note(self, crashed: bool = False) -> str:
        """Where the run can be resumed from, for error messages (``crashed``: the run did not end as planned)."""
        return resume_note(self.state.last_checkpoint, crashed)


def _stop_here(trainer: GANTrainer) -> None:
    """``fit``, at the step where every process agreed to stop: a checkpoint, then at the time limit what the run's
    end writes (the final generator, samples and plot) and a line saying how to go on; on a signal
    :class:`TrainingInterrupted`."""
    signum, step, cfg = trainer.control.stop_signal, trainer.step, trainer.config
    trainer.fire_agreed("on_checkpoint")
    if signum == TIME_LIMIT:
        trainer.fire_agreed("on_fit_end")
        trainer.accelerator.print(f"gan_accel: stopped at the time limit ({describe_duration(cfg.max_time)}) at step "
                                  f"{step:,} of {cfg.max_steps:,}. {trainer.checkpoint_note()}")
        return
    name = {2: "SIGINT", 15: "SIGTERM"}.get(signum, f"signal {signum}")
    raise TrainingInterrupted(f"stopped by {name} at step {step}; {trainer.checkpoint_note()}", signum)


def _remember(error: BaseException, trainer: GANTrainer) -> None:
    """``fit``: write on the error leaving it where the run was (the step, the last checkpoint), for the line."""
    if not hasattr(error, "gan_accel_progress"):
        started = trainer.fit_calls > 0 or trainer.step > 0
        where = f"at step {trainer.step}" if started else "before training started"
        note = trainer.checkpoint_note(not isinstance(error, GanAccelError)) if started else \
            "This launch wrote no checkpoint (the checkpoints of earlier launches, if any, are untouched)."
        error.gan_accel_progress = f"{where}; {note}"  # type: ignore[attr-defined]
        error.gan_accel_timeout = trainer.config.collective_timeout  # type: ignore[attr-defined]
