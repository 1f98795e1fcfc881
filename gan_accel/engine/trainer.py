"""GANTrainer: builds the run (one ``prepare``), then loops over steps and fires the callbacks' events.

The loop, in one place (``fit``)::

    for each step until max_steps:
        runner.run_step()          the due phases, each under Accelerate's rules (engine/runner.py)
        on_step_end                callbacks (EMA, progress, signals, yours)
        on_log / on_sample / on_checkpoint, when due
    on_checkpoint, on_fit_end, on_close

What a step does is data (the phase list, engine/phases.py); what happens around it is callbacks
(gan_accel/callbacks/). The trainer itself owns only the counters, the data stream, the metric
reduction and the checkpoint state.
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
from ..collective import run_together
from ..errors import PreflightError, TrainingInterrupted
from ..state.lock import RunLock
from ..state.run_folder import RunFolder
from .build import ExtraNetwork, collect_networks, prepare_run
from .data_stream import DataStream
from .guard import DivergenceGuard
from .conditioning import conditioning_for
from .latents import (LabelSampler, LatentSampler, draw_fixed_latents, gaussian_latents, generate_samples,
                      leading_size, map_tensors)
from .launch import build_accelerator, check_accelerator, check_launch
from .phases import Phase, PhasePlan, default_phases
from .preflight import check_dataloader, dry_run
from .run_open import open_run
from .trainer_state import restore_trainer_state, trainer_state
from .runner import PhaseRunner
from .running_means import RunningMeans
from .schedules import LRMultiplier


def loss_scale(accelerator: Accelerator) -> dict[str, float]:
    """``{"loss_scale": s}`` with an fp16 GradScaler (a host read: at log rows only), else ``{}``."""
    return {} if accelerator.scaler is None else {"loss_scale": float(accelerator.scaler.get_scale())}


def _entry(table: str, name: str) -> property:
    return property(lambda self: getattr(self, table)[name], doc=f"``self.{table}[{name!r}]``")


class GANTrainer:
    """Trains a generator ``G`` and a discriminator ``D`` (and any extra networks) on Accelerate.

    Args:
        G: maps latents (from ``latent_sampler``) to samples shaped like the real data.
        D: maps samples to one logit per sample.
        train_dataloader: yields real samples (see :func:`~gan_accel.engine.batch.split_batch`); map-style
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
        disable_callbacks: names of built-in callbacks to switch off (e.g. ``("samples", "progress")``).
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
        self.reference_samples = dry_run(nets, plan, train_dataloader, self.sample_latents,
                                         conditioning=self.conditioning, num_reference=max(config.num_samples, 256),
                                         warn=accelerator.is_main_process)
        self.fixed_latents, self.fixed_labels = self._draw_fixed_samples()
        prepared = prepare_run(accelerator, config, plan, nets, optimizers, {"G": sched_G, "D": sched_D},
                               {"G": lr_multiplier_G, "D": lr_multiplier_D}, train_dataloader)
        self.networks, self.optimizers, self.schedulers = prepared.networks, prepared.optimizers, prepared.schedulers
        self.train_dataloader = prepared.dataloader
        self.built_from_config = prepared.built  # the optimizers and schedulers a resume may re-rate
        # Seeded after prepare: the data order must be the same on every process (see build_accelerator),
        # the noise different on each (the same noise everywhere would waste the larger batch).
        set_seed(config.seed, device_specific=True)

        self.step = 0  # passes over the phase list (generator steps with the default list)
        self.data = DataStream(self.train_dataloader, accelerator)
        self.means = RunningMeans()
        self.guard = DivergenceGuard(config.max_bad_updates, tuple(nets), accelerator.print) if config.nan_guard else None
        self.runner = PhaseRunner(accelerator, prepared.train_networks, self.optimizers, self.schedulers, plan,
                                  self.sample_latents, self.means, guard=self.guard, conditioning=self.conditioning,
                                  clip_norms={"G": config.clip_grad_norm_G, "D": config.clip_grad_norm_D})
        self.last_metrics: dict[str, float] = {}
        self.resumed_from: Path | None = None
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_step: int | None = None
        # Checkpoint names never pruned (the best one), and values a callback adds to the next metrics row.
        self.protected_checkpoints, self.pending_metrics = set[str](), dict[str, Any]()
        self._stop_signum: int | None = None
        # The run folder: its lock (held by the main process while fit runs), manifest and history.
        self.lock = RunLock(self.output_dir)
        self.run_folder = RunFolder(self.output_dir, writer=accelerator.is_main_process)
        self.run_id: str | None = None
        self.fit_calls = 0
        self.callbacks = CallbackList(assemble(default_callbacks(config), callbacks, disable_callbacks,
                                               BUILTIN_CALLBACKS))
        self.callbacks.bind(self)

    def _draw_fixed_samples(self) -> tuple[Any, torch.Tensor | None]:
        """The progress samples' latents (and labels: one grid row per class in a conditional run)."""
        cfg = self.config
        count = self.conditioning.fixed_count(cfg.num_samples)
        latents = draw_fixed_latents(self.sample_latents, count, cfg.seed)
        if leading_size(latents) != count:
            raise PreflightError(f"the latent sampler returned {leading_size(latents)} fixed latents when asked "
                                 f"for {count}")
        return latents, self.conditioning.fixed_labels(cfg.num_samples)

    # -- the loop -----------------------------------------------------------------------------
    def fit(self, resume_from: str | Path | None = None, stop_at_step: int | None = None,
            fork: bool = False) -> dict[str, float]:
        """Train until ``config.max_steps`` steps; returns the last logged metrics.

        ``resume_from``: ``"latest"`` or a checkpoint folder; the run continues exactly where it was
        saved (same batches, same noise, same metrics). A checkpoint of another run folder is refused
        unless ``fork=True``, which starts a new run in ``output_dir`` from it. ``stop_at_step``:
        checkpoint and return early at that step (the schedules still run to ``max_steps``); a later
        ``fit()`` of the same trainer continues. SIGINT/SIGTERM: the current step finishes, a
        checkpoint is written, then :class:`TrainingInterrupted` is raised.
        """
        cfg, acc = self.config, self.accelerator
        target = cfg.max_steps if stop_at_step is None else min(stop_at_step, cfg.max_steps)
        try:
            open_run(self, resume_from, fork)
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
                self.runner.run_step(self._phase_end)
                self.step += 1
                self.callbacks.fire("on_step_end")
                last = self.step == cfg.max_steps
                if self.step % cfg.log_every == 0 or last:
                    self.log_metrics()
                if self.step % cfg.sample_every == 0 or last:
                    self.fire_agreed("on_sample")
                if self._stop_signum is not None:
                    self.fire_agreed("on_checkpoint")
                    name = {2: "SIGINT", 15: "SIGTERM"}.get(self._stop_signum, f"signal {self._stop_signum}")
                    raise TrainingInterrupted(f"stopped by {name} at step {self.step}; {self.checkpoint_note()}",
                                              self._stop_signum)
                if self.step % cfg.checkpoint_every == 0 and self.step < target:
                    self.fire_agreed("on_checkpoint")
            self.fire_agreed("on_checkpoint")
            if self.step >= cfg.max_steps:
                self.fire_agreed("on_fit_end")
            acc.wait_for_everyone()
        except BaseException:
            try:
                self.callbacks.fire("on_close")
            except Exception as close_error:  # never hide the error that stopped the run
                acc.print(f"gan_accel: while closing after an error: {close_error}")
            raise
        finally:
            self.lock.release()
        self.callbacks.fire("on_close")
        return self.last_metrics

    def fire_agreed(self, event: str, *args: Any) -> None:
        """Fire an event whose handlers write files on the main process: a failure stops every process alike."""
        run_together(self.accelerator, lambda: self.callbacks.fire(event, *args))

    def _phase_end(self, phase: Phase) -> None:
        self.callbacks.fire("on_phase_end", phase)

    def log_metrics(self) -> dict[str, Any]:
        """Collective (every rank reduces): the means since the last row, then ``on_log(row)``."""
        acc = self.accelerator
        now, images = time.perf_counter(), self.runner.images_seen
        start_time, start_images = self._interval_start
        self._interval_start = (now, images)
        row: dict[str, Any] = {"step": self.step, "d_step": self.d_step, "epoch": self.data.epoch}
        row.update(self.means.reduce(acc))
        row.update({**self.runner.lr_used, **loss_scale(acc)})
        if self.guard is not None:  # the skip counters live on the device; past max_bad_updates this raises
            row.update(self.guard.check(self.step))
        row["images/s"] = (images - start_images) * acc.num_processes / max(now - start_time, 1e-9)
        row.update(self.pending_metrics)
        self.pending_metrics = {}
        self.last_metrics = row
        self.fire_agreed("on_log", row)
        return row

    def request_stop(self, signum: int) -> None:
        """Ask the loop to checkpoint and stop after the current step (call on every rank alike)."""
        self._stop_signum = signum

    def checkpoint_note(self) -> str:
        """Where the run can be resumed from, for error messages."""
        if self.last_checkpoint is None:
            return ("No checkpoint of this run was written, so there is nothing to resume: start it again "
                    "(overwrite=True, --overwrite, removes only the files it wrote).")
        return (f"The last complete checkpoint is {self.last_checkpoint}; resume with --resume latest "
                "(fit(resume_from='latest')) and the same output folder.")

    # -- what the loop produces -----------------------------------------------------------------
    # The prepared networks, optimizers and schedulers by their usual names (all are in the dicts).
    G = _entry("networks", "G")
    D = _entry("networks", "D")
    opt_G = _entry("optimizers", "G")
    opt_D = _entry("optimizers", "D")
    sched_G = _entry("schedulers", "G")
    sched_D = _entry("schedulers", "D")

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
    def ema(self) -> Any:
        """The EMA of G (None without the ``ema`` callback)."""
        callback = self.callbacks.get("ema")
        return callback.ema if callback is not None else None

    @property
    def images_per_step(self) -> int:
        """Latents G trains on in one step, over all processes (batch x accumulation x processes)."""
        return self.config.batch_size * self.config.grad_accum_steps * self.accelerator.num_processes

    def sampling_generator(self) -> nn.Module:
        """The generator to sample from: the EMA when enabled, else the unwrapped G."""
        callback = self.callbacks.get("ema")
        return callback.module if callback is not None else self.accelerator.unwrap_model(self.G)

    def draw_latents(self, count: int, seed: int, device: torch.device | None = None) -> Any:
        """``count`` latents of the run's sampler from ``seed`` (on CPU, or moved to ``device``): the same
        on every process, and the training noise is not shifted (for evaluation and the EMA's statistics)."""
        latents = draw_fixed_latents(self.sample_latents, count, seed)
        return latents if device is None else map_tensors(latents, lambda t: t.to(device))

    def generate(self, latents: Any = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Samples from :meth:`sampling_generator` in eval mode: the fixed latents (and fixed labels)
        by default; a conditional run needs ``labels`` (class indices) with its own ``latents``."""
        if latents is None:
            latents, labels = self.fixed_latents, self.fixed_labels if labels is None else labels
        if self.conditioning.conditional and labels is None:
            raise ValueError("a conditional run samples G(z, y): pass labels (class indices) with the latents")
        return generate_samples(self.sampling_generator(), latents, self.accelerator,
                                labels if self.conditioning.conditional else None)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state on this process (Accelerate's is saved by ``save_state``)."""
        return trainer_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_trainer_state(self, state)
