"""The two-network training engine.

One batch = one entry into ``accelerator.accumulate(G, D)`` (Accelerate keeps one accumulation
counter per process and advances it on every entry, so entering once per model would double-count).
Inside it:

* D phase: fakes from G (no graph unless reused below), ``d_loss(D(real), D(fake.detach()))``,
  ``accelerator.backward``; on the sync micro-batch the D optimizer and scheduler step, then
  ``zero_grad`` (prepared optimizers skip step/zero_grad on the other micro-batches, so a leading
  ``zero_grad`` would wipe what was accumulated).
* G phase, after every ``n_critic``-th D step: D frozen (``requires_grad_(False)``) so G's loss
  leaves no gradient in D, then ``g_loss(D(G(z)))`` for the latents of the whole accumulation window,
  then the G step. Running G's phase after D has stepped, on the same latents as D's phase, makes
  accumulation over k micro-batches exactly equivalent to one k-times larger batch. Without
  accumulation the fakes of the D phase are reused (one G forward per batch, as pytorch/examples).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from .config import TrainConfig
from .ema import EMA
from .export import save_weights
from .guard import DivergenceError, DivergenceGuard, grads_and_loss_finite, parameters_finite
from .launch import build_accelerator, check_accelerator, check_launch
from .preflight import check_dataloader, check_output_dir, clear_run_files, dry_forward
from .signals import StopFlag, TrainingInterrupted, stop_on_signals
from .sampling import LatentSampler, fixed_noise, gaussian_latents, save_gif, save_grid
from .schedules import LRMultiplier, lambda_scheduler, scheduler_ticks_per_optimizer_step, warmup_then_decay
from .tracking import MetricsLog, RunningMeans, truncate_metrics

IMAGE_KEYS = ("image", "images", "pixel_values", "img")


def extract_images(batch: Any) -> torch.Tensor:
    """The image tensor of a dataloader batch: a tensor, a (tensor, label, ...) pair, or a dict."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Sequence) and not isinstance(batch, str) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]
    if isinstance(batch, Mapping):
        for key in IMAGE_KEYS:
            if isinstance(batch.get(key), torch.Tensor):
                return batch[key]
    raise TypeError(
        f"unsupported batch of type {type(batch).__name__}: the dataloader must yield an image tensor, "
        f"a (images, labels) tuple/list, or a dict with one of the keys {list(IMAGE_KEYS)}"
    )


class GANTrainer:
    """Trains a generator ``G`` and a discriminator ``D`` with alternating updates on Accelerate.

    Args:
        G: maps a latent batch (from ``latent_sampler``) to images.
        D: maps images to one logit per image.
        train_dataloader: yields real images (see :func:`extract_images` for accepted forms).
        config: the run's :class:`TrainConfig`.
        accelerator: built from ``config`` when omitted (see :func:`gan_accel.launch.build_accelerator`).
        opt_G, opt_D: default to Adam with the config's learning rates and betas.
        sched_G, sched_D: default to linear warmup then decay, counted in optimizer steps. A scheduler
            you pass must not be multiplied by Accelerate's per-process stepping: on several processes
            pass ``lr_multiplier_G``/``lr_multiplier_D`` (a function of the optimizer step) instead.
        lr_multiplier_G, lr_multiplier_D: custom schedules, as multipliers of the base lr by step.
        latent_sampler: ``(batch_size, device) -> latents``; defaults to ``randn(batch_size, z_dim)``.
    """

    def __init__(
        self,
        G: nn.Module,
        D: nn.Module,
        train_dataloader: DataLoader,
        config: TrainConfig,
        *,
        accelerator: Accelerator | None = None,
        opt_G: torch.optim.Optimizer | None = None,
        opt_D: torch.optim.Optimizer | None = None,
        sched_G: torch.optim.lr_scheduler.LRScheduler | None = None,
        sched_D: torch.optim.lr_scheduler.LRScheduler | None = None,
        lr_multiplier_G: LRMultiplier | None = None,
        lr_multiplier_D: LRMultiplier | None = None,
        latent_sampler: LatentSampler | None = None,
    ) -> None:
        config.validate()
        self.config = config
        if accelerator is None:
            accelerator = build_accelerator(config)  # checks the launch itself
        else:
            check_launch(accelerator)
            check_accelerator(accelerator, config)
        self.accelerator = accelerator
        self.sample_latents = latent_sampler or gaussian_latents(config.z_dim)
        # Preflight on the raw modules and loader: a wrong shape or batch form costs seconds, not a run.
        check_dataloader(train_dataloader, config.batch_size)
        dry_forward(G, D, train_dataloader, self.sample_latents, extract_images)
        opt_G = opt_G or torch.optim.Adam(G.parameters(), lr=config.lr_G, betas=config.betas_G)
        opt_D = opt_D or torch.optim.Adam(D.parameters(), lr=config.lr_D, betas=config.betas_D)
        ticks = scheduler_ticks_per_optimizer_step(self.accelerator)
        sched_G = self._scheduler(sched_G, lr_multiplier_G, opt_G, config.max_steps, ticks, "G")
        sched_D = self._scheduler(sched_D, lr_multiplier_D, opt_D, config.d_steps, ticks, "D")

        # The one prepare: Accelerate wraps the models (DDP), places everything on its device and
        # shards the dataloader. Nothing in gan_accel calls .to(device) on a model.
        (self.G, self.D, self.opt_G, self.opt_D, self.sched_G, self.sched_D, self.train_dataloader) = (
            self.accelerator.prepare(G, D, opt_G, opt_D, sched_G, sched_D, train_dataloader)
        )
        # Seeded after prepare: the data order must be the same on every process (see build_accelerator),
        # the noise different on each (the same noise everywhere would waste the larger batch).
        set_seed(config.seed, device_specific=True)
        self.loss = config.loss_fn
        self.ema = EMA(self.accelerator.unwrap_model(self.G), config.ema_decay) if config.ema_decay else None
        self.fixed_noise = fixed_noise(config.num_samples, config.z_dim, config.seed).to(self.accelerator.device)
        self.output_dir = Path(config.output_dir)

        self.step = 0  # generator optimizer steps
        self.d_step = 0  # discriminator optimizer steps
        self.epoch = 0
        self.batches_in_epoch = 0  # position in the current epoch, for mid-epoch resume
        self.images_seen = 0  # real images, per process
        self._window_latents: list[torch.Tensor] = []
        self._window_loss: torch.Tensor | None = None  # the window's summed D loss, for the guard
        self._means = RunningMeans()
        self.guard = DivergenceGuard(config.max_bad_updates)
        self._stop = StopFlag()
        self.metrics = MetricsLog(self.output_dir / "metrics.jsonl", enabled=self.accelerator.is_main_process)
        self.last_metrics: dict[str, float] = {}
        self._lr_used: dict[str, float] = {}

    # -- construction helpers -----------------------------------------------------------------
    def _scheduler(self, sched, multiplier, optimizer, total_steps: int, ticks: int, name: str):
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
            warmup = int(self.config.warmup_ratio * total_steps)
            multiplier = warmup_then_decay(total_steps, warmup, self.config.lr_schedule)
        return lambda_scheduler(optimizer, multiplier, ticks)

    # -- the loop -----------------------------------------------------------------------------
    def fit(self, resume_from: str | Path | None = None, stop_at_step: int | None = None) -> dict[str, float]:
        """Train until ``config.max_steps`` generator steps; returns the last logged metrics.

        ``resume_from``: ``"latest"`` or a checkpoint folder; the run continues exactly where it was
        saved (same batches, same noise, same metrics). ``stop_at_step``: checkpoint and return early
        at that step (the schedules still run to ``max_steps``).
        SIGINT/SIGTERM: the current step finishes, a checkpoint is written, then
        :class:`TrainingInterrupted` is raised.
        """
        cfg, acc = self.config, self.accelerator
        target = cfg.max_steps if stop_at_step is None else min(stop_at_step, cfg.max_steps)
        resume_path = resolve_resume(resume_from, cfg.output_dir) if resume_from is not None else None
        check_output_dir(cfg.output_dir, resuming=resume_path is not None, overwrite=cfg.overwrite)
        acc.wait_for_everyone()  # every rank has looked at the folder before the main process writes to it
        if resume_path is not None:
            self.load_state_dict(load_checkpoint(acc, resume_path, acc.process_index))
            acc.print(f"gan_accel: resumed from {resume_path} at step {self.step}")
        self._start_run(resumed=resume_path is not None)
        batches = self._batches()
        bar = tqdm(
            total=cfg.max_steps, initial=self.step, desc="train", dynamic_ncols=True,
            disable=not (acc.is_local_main_process and cfg.progress_bar),
        )
        self._interval_start = (time.perf_counter(), self.images_seen)
        with stop_on_signals(self._stop):
            while self.step < target:
                real = extract_images(next(batches))
                with acc.accumulate(self.G, self.D):
                    stepped_G = self.train_on_batch(real)
                if not stepped_G:
                    continue
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    self._log()
                    bar.set_postfix({k: f"{self.last_metrics[k]:.3g}" for k in ("loss/D", "loss/G", "images/s")})
                if self.step % cfg.sample_every == 0 or self.step == cfg.max_steps:
                    self.save_samples()
                if self._stop_requested():
                    bar.close()
                    path = self.save_checkpoint()
                    name = {2: "SIGINT", 15: "SIGTERM"}.get(self._stop.signum, f"signal {self._stop.signum}")
                    raise TrainingInterrupted(
                        f"stopped by {name} at step {self.step}; checkpoint saved to {path}. Resume with "
                        "--resume latest (or fit(resume_from='latest')) and the same output folder",
                        self._stop.signum or 0,
                    )
                if self.step % cfg.checkpoint_every == 0 and self.step < target:
                    self.save_checkpoint()
        bar.close()
        self.save_checkpoint()
        if self.step >= cfg.max_steps:
            self._finish_run()
        acc.wait_for_everyone()
        return self.last_metrics

    def train_on_batch(self, real: torch.Tensor) -> bool:
        """One micro-batch: D phase, and the G phase when this completes an n_critic cycle.

        Must run inside ``accelerator.accumulate(G, D)``. Returns True when G stepped.
        """
        cfg, acc = self.config, self.accelerator
        generator_window = (self.d_step + 1) % cfg.n_critic == 0
        reuse_fakes = generator_window and cfg.grad_accum_steps == 1
        self.images_seen += real.shape[0]

        latents = self.sample_latents(real.shape[0], acc.device)
        with acc.autocast():
            with contextlib.nullcontext() if reuse_fakes else torch.no_grad():
                fake = self.G(latents)
            real_logits = self.D(real)
            fake_logits = self.D(fake.detach())
            loss_D = self.loss.d_loss(real_logits, fake_logits)
        self.accelerator.backward(loss_D)
        loss_D = loss_D.detach()
        self._window_loss = loss_D if self._window_loss is None else self._window_loss + loss_D
        self._means.add("loss/D", loss_D)
        self._means.add("D(x)", real_logits.mean())
        self._means.add("D(G(z))", fake_logits.mean())
        if generator_window and not reuse_fakes:
            self._window_latents.append(latents)

        if not acc.sync_gradients:
            return False
        window_loss, self._window_loss = self._window_loss, None
        if self._update_is_finite("D", self.D, window_loss):
            self._clip("D", self.D, self.opt_D, cfg.clip_grad_norm_D)
            self._lr_used["lr/D"] = self.opt_D.param_groups[0]["lr"]  # this step's lr, before the scheduler moves it
            self.opt_D.step()
        self.sched_D.step()  # a skipped update still uses up its step of the schedule
        self.opt_D.zero_grad(set_to_none=True)
        self.d_step += 1
        if not generator_window:
            return False
        self._generator_phase(fake if reuse_fakes else None)
        return True

    def _generator_phase(self, reused_fake: torch.Tensor | None) -> None:
        """Accumulate G's loss over the window's latents with D frozen, then step G."""
        acc = self.accelerator
        work = [reused_fake] if reused_fake is not None else self._window_latents
        self._window_latents = []
        # Frozen D: G's loss must not leave gradients in D (under accumulation no zero_grad would
        # clear them before D's next step). no_sync(D): D's DDP reducer has nothing to reduce here.
        self.D.requires_grad_(False)
        window_loss = None
        try:
            for index, item in enumerate(work):
                last = index == len(work) - 1
                # Only the last backward of the window all-reduces G's gradients.
                sync_context = contextlib.nullcontext() if last else acc.no_sync(self.G)
                with sync_context, acc.no_sync(self.D), acc.autocast():
                    fake = item if reused_fake is not None else self.G(item)
                    loss_G = self.loss.g_loss(self.D(fake))
                    self.accelerator.backward(loss_G)
                self._means.add("loss/G", loss_G)
                window_loss = loss_G.detach() if window_loss is None else window_loss + loss_G.detach()
        finally:
            self.D.requires_grad_(True)
        if self._update_is_finite("G", self.G, window_loss):
            self._clip("G", self.G, self.opt_G, self.config.clip_grad_norm_G)
            self._lr_used["lr/G"] = self.opt_G.param_groups[0]["lr"]
            self.opt_G.step()
        self.sched_G.step()
        self.opt_G.zero_grad(set_to_none=True)
        self.step += 1
        if self.ema is not None:
            self.ema.update(self.accelerator.unwrap_model(self.G))

    def _update_is_finite(self, name: str, model: nn.Module, window_loss: torch.Tensor) -> bool:
        """The divergence guard's verdict on this optimizer step, agreed by all ranks (one host sync)."""
        if not self.config.nan_guard:
            return True
        acc = self.accelerator
        # With an fp16 GradScaler, inf/NaN gradients are the scaler's business (it skips those steps).
        finite = grads_and_loss_finite(model, window_loss, check_grads=acc.scaler is None)
        if acc.num_processes > 1:  # a local NaN loss must skip the update on every rank alike
            finite = acc.reduce(finite.float(), reduction="sum") == acc.num_processes
        ok = bool(finite.item())
        if not ok:
            acc.print(f"gan_accel: step {self.step}: non-finite {name} loss or gradients; update skipped")
            model.zero_grad(set_to_none=True)  # the prepared optimizer's zero_grad may follow, but be sure
        self.guard.record(name, ok, self.step)
        return ok

    def _clip(self, name: str, model: nn.Module, optimizer, max_norm: float | None) -> None:
        if max_norm is None:
            return
        # fp16: the GradScaler is shared by both optimizers; unscale only this network's gradients
        # (accelerator.clip_grad_norm_ would unscale every optimizer).
        self.accelerator.unscale_gradients(optimizer=optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        self._means.add(f"grad_norm/{name}", norm)

    def _batches(self) -> Iterator[Any]:
        """Endless batches, epoch after epoch (set_epoch reshuffles through the seedable sampler)."""
        if len(self.train_dataloader) == 0:
            raise ValueError("the training dataloader yields no batches: check the dataset size and drop_last")
        while True:
            loader = self.train_dataloader
            loader.set_epoch(self.epoch)  # the seedable sampler's order is a function of (seed, epoch)
            if self.batches_in_epoch:  # resumed mid-epoch: the same order, minus what was consumed
                loader = self.accelerator.skip_first_batches(loader, self.batches_in_epoch)
            iterator = iter(loader)
            # Starting a DataLoader iterator draws a base seed from the global RNG. Keep that draw out
            # of the noise stream, so a run resumed mid-epoch draws the same noise as an uninterrupted one.
            with torch.random.fork_rng(devices=[]):
                batch = next(iterator, None)
            while batch is not None:
                self.batches_in_epoch += 1
                yield batch
                batch = next(iterator, None)
            self.epoch += 1
            self.batches_in_epoch = 0

    # -- hooks hanging off the loop -----------------------------------------------------------
    def _start_run(self, resumed: bool) -> None:
        acc = self.accelerator
        if acc.is_main_process:
            if self.config.overwrite and not resumed:
                clear_run_files(self.output_dir)
            if resumed:  # rows past the checkpoint came from the lost part of the run: they will be redone
                truncate_metrics(self.metrics.path, self.step)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.config.to_json(self.output_dir / "config.json")
            torch.save(self.fixed_noise.cpu(), self.output_dir / "fixed_noise.pt")
        if self.accelerator.mixed_precision == "fp16" and self.accelerator.scaler is None:
            acc.print("gan_accel: fp16 was requested but Accelerate runs fp32 on this device (CPU); use bf16 on CPU")
        acc.wait_for_everyone()

    def _finish_run(self) -> None:
        """Final grid, progress GIF and the generator's weights (the EMA's when enabled)."""
        if not self.accelerator.is_main_process:
            return
        save_grid(self.generate(), self.output_dir / "samples_final.png")
        frames = sorted(self.output_dir.glob("samples_[0-9]*.png"))
        if frames:
            save_gif(frames, self.output_dir / "progress.gif")
        metadata = {"config": self.config.to_dict(), "step": self.step, "ema": self.ema is not None}
        save_weights(self.sampling_generator(), self.output_dir / "generator.safetensors", metadata)

    def sampling_generator(self) -> nn.Module:
        """The generator to sample from: the EMA when enabled, else the unwrapped G."""
        return self.ema.module if self.ema is not None else self.accelerator.unwrap_model(self.G)

    def _log(self) -> None:
        """Collective (every rank reduces), then the main process writes one row."""
        acc = self.accelerator
        now, images = time.perf_counter(), self.images_seen
        start_time, start_images = self._interval_start
        self._interval_start = (now, images)
        row: dict[str, Any] = {"step": self.step, "d_step": self.d_step, "epoch": self.epoch}
        row.update(self._means.reduce(acc))
        row.update(self._lr_used)
        row.update({f"skipped/{k}": v for k, v in self.guard.skipped.items()})
        row["images/s"] = (images - start_images) * acc.num_processes / max(now - start_time, 1e-9)
        self.last_metrics = row
        self.metrics.write(row)

    @torch.no_grad()
    def generate(self, latents: torch.Tensor | None = None) -> torch.Tensor:
        """Images from :meth:`sampling_generator` in eval mode (defaults to the fixed noise).

        Uses the unwrapped module: calling the DDP wrapper on the main process alone could start a
        collective the other ranks never join.
        """
        G = self.sampling_generator()
        latents = self.fixed_noise if latents is None else latents
        param = next(G.parameters(), None)
        if param is not None and param.is_floating_point():
            latents = latents.to(param.dtype)  # e.g. a float64 G; autocast still applies on top
        was_training = G.training
        G.eval()
        try:
            with self.accelerator.autocast():
                return G(latents).float()
        finally:
            G.train(was_training)

    def save_samples(self) -> Path | None:
        """Write ``samples_<step>.png`` from the fixed noise (main process only)."""
        if not self.accelerator.is_main_process:
            return None
        return save_grid(self.generate(), self.output_dir / f"samples_{self.step:06d}.png")

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The engine's own state (Accelerate's is saved by ``save_state``); per process."""
        return {
            "step": self.step, "d_step": self.d_step, "epoch": self.epoch,
            "batches_in_epoch": self.batches_in_epoch, "images_seen": self.images_seen,
            "means": self._means.state_dict(), "lr_used": dict(self._lr_used),
            "guard": self.guard.state_dict(), "ema": self.ema.state_dict() if self.ema else None,
            "fixed_noise": self.fixed_noise.cpu(), "config": self.config.to_dict(),
            "num_processes": self.accelerator.num_processes,
            # Accelerate saves the main process's model only; BatchNorm statistics are per process
            # (broadcast_buffers=False), so each rank keeps its own for an exact continuation.
            "buffers": {name: self._buffers(model) for name, model in (("G", self.G), ("D", self.D))},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_processes"] != self.accelerator.num_processes:
            self.accelerator.print(
                f"gan_accel: warning: checkpoint written by {state['num_processes']} processes, resuming on "
                f"{self.accelerator.num_processes}: the data order and noise will differ from an uninterrupted run"
            )
        if (state["ema"] is None) != (self.ema is None):
            raise ValueError("the checkpoint and the config disagree on ema_decay: use the run's original config")
        for key in ("step", "d_step", "epoch", "batches_in_epoch", "images_seen"):
            setattr(self, key, int(state[key]))
        self._means.load_state_dict(state["means"], self.accelerator.device)
        self._lr_used = dict(state["lr_used"])
        self.guard.load_state_dict(state["guard"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        self.fixed_noise = state["fixed_noise"].to(self.accelerator.device)
        for name, model in (("G", self.G), ("D", self.D)):
            for key, buffer in self.accelerator.unwrap_model(model).named_buffers():
                buffer.copy_(state["buffers"][name][key])

    def _buffers(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: b.detach().cpu().clone() for k, b in self.accelerator.unwrap_model(model).named_buffers()}

    def save_checkpoint(self) -> Path:
        """Collective: a complete checkpoint of this step, or an error if the weights are not finite."""
        if not parameters_finite(self.G, self.D):
            raise DivergenceError(
                f"refusing to write a checkpoint at step {self.step}: G or D holds non-finite weights; "
                "the last complete checkpoint is kept"
            )
        return save_checkpoint(self.accelerator, self.config.output_dir, self.step, self.state_dict(),
                               self.config.keep_checkpoints)

    def _stop_requested(self) -> bool:
        """Whether a signal asked to stop, agreed by all ranks so they checkpoint at the same step."""
        if self.accelerator.num_processes == 1:
            return bool(self._stop)
        flag = torch.tensor([1.0 if self._stop else 0.0], device=self.accelerator.device)
        stop = self.accelerator.reduce(flag, reduction="sum").item() > 0
        if stop and self._stop.signum is None:
            self._stop.signum = 15  # another rank got the signal
        return stop
