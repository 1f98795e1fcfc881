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
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from ..callbacks import BUILTIN_CALLBACKS, CallbackList, default_callbacks
from ..config import TrainConfig
from ..errors import CheckpointError, PreflightError, TrainingInterrupted
from ..state.checkpoint import load_checkpoint, resolve_resume
from ..state.run_folder import check_output_dir, clear_run_files, write_run_description
from ..batch import RealBatch, split_batch
from .guard import DivergenceGuard
from .latents import LatentSampler, draw_fixed_latents, gaussian_latents, leading_size, map_tensors
from .launch import build_accelerator, check_accelerator, check_launch
from .phases import Phase, PhasePlan, default_phases
from .preflight import check_dataloader, dry_run
from .runner import PhaseRunner
from .running_means import RunningMeans
from .schedules import LRMultiplier, lambda_scheduler, scheduler_ticks_per_optimizer_step, warmup_then_decay

ExtraNetwork = nn.Module | tuple[nn.Module, torch.optim.Optimizer]


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
                 latent_sampler: LatentSampler | None = None, phases: Sequence[Phase] | None = None,
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
        nets, optimizers = {"G": G, "D": D}, {"G": opt_G, "D": opt_D}
        for name, extra in (extra_networks or {}).items():
            if name in nets:
                raise PreflightError(f"extra network name {name!r} is taken: use another name than 'G' and 'D'")
            nets[name], optimizers[name] = extra if isinstance(extra, tuple) else (extra, None)
        plan = PhasePlan(phases if phases is not None else default_phases(config), nets)

        # Preflight on the raw modules and loader: a wrong shape, batch form or phase costs seconds, not a run.
        check_dataloader(train_dataloader, config.batch_size)
        self.reference_samples = dry_run(nets, plan, train_dataloader, self.sample_latents,
                                         num_reference=max(config.num_samples, 256),
                                         warn=accelerator.is_main_process)
        self.fixed_latents = draw_fixed_latents(self.sample_latents, config.num_samples, config.seed)
        if leading_size(self.fixed_latents) != config.num_samples:
            raise PreflightError(f"the latent sampler returned {leading_size(self.fixed_latents)} fixed latents "
                                 f"when asked for num_samples={config.num_samples}")
        schedulers = {"G": sched_G, "D": sched_D}
        multipliers = {"G": lr_multiplier_G, "D": lr_multiplier_D}
        ticks = scheduler_ticks_per_optimizer_step(accelerator)
        for name, net in nets.items():
            if optimizers[name] is None:
                lr, betas = (config.lr_D, config.betas_D) if name == "D" else (config.lr_G, config.betas_G)
                optimizers[name] = torch.optim.Adam(net.parameters(), lr=lr, betas=betas)
            total = max(1, plan.scheduler_steps(name, config.max_steps))
            schedule = config.lr_schedule if name in ("G", "D") else "constant"
            schedulers[name] = self._scheduler(schedulers.get(name), multipliers.get(name), optimizers[name],
                                               total, ticks, name, schedule)

        # The one prepare: Accelerate wraps the networks (DDP), places everything on its device and
        # shards the dataloader. Nothing in gan_accel calls .to(device) on a model.
        names = list(nets)
        prepared = accelerator.prepare(*nets.values(), *(optimizers[n] for n in names),
                                       *(schedulers[n] for n in names), train_dataloader)
        n = len(names)
        self.networks = dict(zip(names, prepared[:n]))
        self.optimizers = dict(zip(names, prepared[n:2 * n]))
        self.schedulers = dict(zip(names, prepared[2 * n:3 * n]))
        self.train_dataloader = prepared[-1]
        # Seeded after prepare: the data order must be the same on every process (see build_accelerator),
        # the noise different on each (the same noise everywhere would waste the larger batch).
        set_seed(config.seed, device_specific=True)

        self.step = 0  # passes over the phase list (generator steps with the default list)
        self.epoch = 0
        self.batches_in_epoch = 0  # position in the current epoch, for mid-epoch resume
        self.means = RunningMeans()
        self.guard = DivergenceGuard(config.max_bad_updates, tuple(names)) if config.nan_guard else None
        self.runner = PhaseRunner(accelerator, self.networks, self.optimizers, self.schedulers, plan,
                                  self.sample_latents, self.means, guard=self.guard,
                                  clip_norms={"G": config.clip_grad_norm_G, "D": config.clip_grad_norm_D})
        self.last_metrics: dict[str, float] = {}
        self.resumed_from: Path | None = None
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_step: int | None = None
        self._stop_signum: int | None = None
        self.callbacks = CallbackList(self._merge_callbacks(default_callbacks(config), callbacks, disable_callbacks))
        self.callbacks.bind(self)

    # -- construction helpers -----------------------------------------------------------------
    def _scheduler(self, sched, multiplier, optimizer, total_steps: int, ticks: int, name: str, schedule: str):
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
            multiplier = warmup_then_decay(total_steps, int(self.config.warmup_ratio * total_steps), schedule)
        return lambda_scheduler(optimizer, multiplier, ticks)

    @staticmethod
    def _merge_callbacks(builtins: list, user: Iterable[Any], disabled: Iterable[str]) -> list:
        disabled = set(disabled)
        unknown = disabled - set(BUILTIN_CALLBACKS)
        if unknown:
            raise ValueError(f"disable_callbacks={sorted(unknown)}: built-in callbacks are {list(BUILTIN_CALLBACKS)}")
        merged = [c for c in builtins if c.name not in disabled]
        for callback in user:
            name = getattr(callback, "name", "") or type(callback).__name__
            position = next((i for i, c in enumerate(merged) if getattr(c, "name", "") == name), None)
            if position is None:
                merged.append(callback)
            else:
                merged[position] = callback
        return merged

    # -- the loop -----------------------------------------------------------------------------
    def fit(self, resume_from: str | Path | None = None, stop_at_step: int | None = None) -> dict[str, float]:
        """Train until ``config.max_steps`` steps; returns the last logged metrics.

        ``resume_from``: ``"latest"`` or a checkpoint folder; the run continues exactly where it was
        saved (same batches, same noise, same metrics). ``stop_at_step``: checkpoint and return early
        at that step (the schedules still run to ``max_steps``). SIGINT/SIGTERM: the current step
        finishes, a checkpoint is written, then :class:`TrainingInterrupted` is raised.
        """
        cfg, acc = self.config, self.accelerator
        target = cfg.max_steps if stop_at_step is None else min(stop_at_step, cfg.max_steps)
        resume_path = resolve_resume(resume_from, cfg.output_dir) if resume_from is not None else None
        check_output_dir(cfg.output_dir, resuming=resume_path is not None, overwrite=cfg.overwrite)
        acc.wait_for_everyone()  # every rank has looked at the folder before the main process writes to it
        if resume_path is not None:
            self.load_state_dict(load_checkpoint(acc, resume_path, acc.process_index))
            self.resumed_from = self.last_checkpoint = resume_path
            self.last_checkpoint_step = self.step
            acc.print(f"gan_accel: resumed from {resume_path} at step {self.step}")
        if acc.is_main_process:
            if cfg.overwrite and resume_path is None:
                clear_run_files(self.output_dir)
            write_run_description(self.output_dir, cfg, self.fixed_latents)
        if acc.mixed_precision == "fp16" and acc.scaler is None:
            acc.print("gan_accel: fp16 was requested but Accelerate runs fp32 on this device (CPU); use bf16 on CPU")
        acc.wait_for_everyone()
        self.runner.batches = self._batches()
        self._interval_start = (time.perf_counter(), self.runner.images_seen)
        try:
            self.callbacks.fire("on_fit_start")
            while self.step < target:
                self.runner.ctx.step = self.step
                self.runner.run_step(self._phase_end)
                self.step += 1
                self.callbacks.fire("on_step_end")
                last = self.step == cfg.max_steps
                if self.step % cfg.log_every == 0 or last:
                    self.log_metrics()
                if self.step % cfg.sample_every == 0 or last:
                    self.callbacks.fire("on_sample")
                if self._stop_signum is not None:
                    self.callbacks.fire("on_checkpoint")
                    name = {2: "SIGINT", 15: "SIGTERM"}.get(self._stop_signum, f"signal {self._stop_signum}")
                    raise TrainingInterrupted(f"stopped by {name} at step {self.step}; {self.checkpoint_note()}",
                                              self._stop_signum)
                if self.step % cfg.checkpoint_every == 0 and self.step < target:
                    self.callbacks.fire("on_checkpoint")
            self.callbacks.fire("on_checkpoint")
            if self.step >= cfg.max_steps:
                self.callbacks.fire("on_fit_end")
            acc.wait_for_everyone()
        finally:
            self.callbacks.fire("on_close")
        return self.last_metrics

    def _phase_end(self, phase: Phase) -> None:
        self.callbacks.fire("on_phase_end", phase)

    def _batches(self) -> Iterator[RealBatch]:
        """Endless batches, epoch after epoch (set_epoch reshuffles through the seedable sampler)."""
        loader = self.train_dataloader
        iterable = isinstance(getattr(loader, "dataset", None), IterableDataset)
        if self.batches_in_epoch and iterable:
            self.accelerator.print(
                f"gan_accel: note: the data is an IterableDataset, so resuming mid-epoch reads and skips "
                f"{self.batches_in_epoch} batches; the run continues exactly only if the dataset yields the "
                "same items in the same order for a given epoch (set_epoch)")
        while True:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(self.epoch)  # the seedable sampler's order is a function of (seed, epoch)
            current = loader
            if self.batches_in_epoch:  # resumed mid-epoch: the same order, minus what was consumed
                current = self.accelerator.skip_first_batches(loader, self.batches_in_epoch)
            iterator = iter(current)
            # Starting a DataLoader iterator draws a base seed from the global RNG. Keep that draw out
            # of the noise stream, so a run resumed mid-epoch draws the same noise as an uninterrupted one.
            with torch.random.fork_rng(devices=[]):
                batch = next(iterator, None)
            if batch is None and self.batches_in_epoch == 0:
                raise PreflightError(f"the training data yielded no batch in epoch {self.epoch}: an empty "
                                     "IterableDataset, or fewer items than one batch with drop_last=True")
            while batch is not None:
                self.batches_in_epoch += 1
                yield split_batch(batch)
                batch = next(iterator, None)
            self.epoch += 1
            self.batches_in_epoch = 0

    def log_metrics(self) -> dict[str, Any]:
        """Collective (every rank reduces): the means since the last row, then ``on_log(row)``."""
        acc = self.accelerator
        now, images = time.perf_counter(), self.runner.images_seen
        start_time, start_images = self._interval_start
        self._interval_start = (now, images)
        row: dict[str, Any] = {"step": self.step, "d_step": self.d_step, "epoch": self.epoch}
        row.update(self.means.reduce(acc))
        row.update(self.runner.lr_used)
        if self.guard is not None:
            row.update({f"skipped/{k}": v for k, v in self.guard.skipped.items()})
        row["images/s"] = (images - start_images) * acc.num_processes / max(now - start_time, 1e-9)
        self.last_metrics = row
        self.callbacks.fire("on_log", row)
        return row

    def request_stop(self, signum: int) -> None:
        """Ask the loop to checkpoint and stop after the current step (call on every rank alike)."""
        self._stop_signum = signum

    def checkpoint_note(self) -> str:
        """Where the run can be resumed from, for error messages."""
        if self.last_checkpoint is None:
            return "No checkpoint of this run was written."
        return (f"The last complete checkpoint is {self.last_checkpoint}; resume with --resume latest "
                "(fit(resume_from='latest')) and the same output folder.")

    # -- what the loop produces -----------------------------------------------------------------
    @property
    def G(self) -> nn.Module:
        return self.networks["G"]

    @property
    def D(self) -> nn.Module:
        return self.networks["D"]

    @property
    def opt_G(self) -> Any:
        return self.optimizers["G"]

    @property
    def opt_D(self) -> Any:
        return self.optimizers["D"]

    @property
    def sched_G(self) -> Any:
        return self.schedulers["G"]

    @property
    def sched_D(self) -> Any:
        return self.schedulers["D"]

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

    def sampling_generator(self) -> nn.Module:
        """The generator to sample from: the EMA when enabled, else the unwrapped G."""
        ema = self.ema
        return ema.module if ema is not None else self.accelerator.unwrap_model(self.G)

    @torch.no_grad()
    def generate(self, latents: Any = None) -> torch.Tensor:
        """Samples from :meth:`sampling_generator` in eval mode (defaults to the fixed latents).

        Uses the unwrapped module: calling the DDP wrapper on the main process alone could start a
        collective the other ranks never join.
        """
        G = self.sampling_generator()
        latents = self.fixed_latents if latents is None else latents
        param = next(G.parameters(), None)
        device = param.device if param is not None else self.accelerator.device
        dtype = param.dtype if param is not None and param.is_floating_point() else None
        # e.g. a float64 G gets float64 latents; autocast still applies on top
        latents = map_tensors(latents, lambda t: t.to(device, dtype if dtype and t.is_floating_point() else t.dtype))
        was_training = G.training
        G.eval()
        try:
            with self.accelerator.autocast():
                return G(latents).float()
        finally:
            G.train(was_training)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state on this process (Accelerate's is saved by ``save_state``)."""
        return {
            "step": self.step, "epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch,
            "runner": self.runner.state_dict(), "means": self.means.state_dict(),
            "guard": self.guard.state_dict() if self.guard is not None else None,
            "callbacks": self.callbacks.state_dict(), "fixed_latents": self.fixed_latents,
            "config": self.config.to_dict(), "num_processes": self.accelerator.num_processes,
            # Accelerate saves the main process's models only; BatchNorm statistics are per process
            # (broadcast_buffers=False), so each rank keeps its own for an exact continuation.
            "buffers": {name: {k: b.detach().cpu().clone() for k, b in self.accelerator.unwrap_model(net).named_buffers()}
                        for name, net in self.networks.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        acc = self.accelerator
        if state["num_processes"] != acc.num_processes:
            acc.print(f"gan_accel: warning: checkpoint written by {state['num_processes']} processes, resuming on "
                      f"{acc.num_processes}: the data order and noise will differ from an uninterrupted run")
        saved, current = set(state["callbacks"]), {n for n, s in self.callbacks.state_dict().items()}
        if saved != current:
            raise CheckpointError(
                f"the checkpoint holds the state of callbacks {sorted(saved)} but this run has {sorted(current)} "
                "(e.g. ema_decay differs): resume with the run's original config")
        for key in ("step", "epoch", "batches_in_epoch"):
            setattr(self, key, int(state[key]))
        self.runner.load_state_dict(state["runner"])
        self.means.load_state_dict(state["means"], acc.device)
        if self.guard is not None and state["guard"] is not None:
            self.guard.load_state_dict(state["guard"])
        self.callbacks.load_state_dict(state["callbacks"])
        self.fixed_latents = state["fixed_latents"]
        for name, net in self.networks.items():
            for key, buffer in acc.unwrap_model(net).named_buffers():
                buffer.copy_(state["buffers"][name][key])
