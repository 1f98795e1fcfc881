"""Opening the run folder at the start of ``fit``: the lock, a new run or a resume, the history.

Every rule here keeps data: one run writes a folder at a time (the lock); a new run never starts
over another one unless asked, and then removes only the files that run recorded; a checkpoint is
resumed only into the folder that wrote it unless forked; resuming an older checkpoint moves the
newer ones aside (a branch); a config change on resume is refused or applied for real, and dated.

Every process reaches the same decision: checks read the same files on every rank, and what only the
main process does (the lock, the manifest, moving files) is agreed with :func:`run_together`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..collective import run_together
from ..config import compare_configs
from ..errors import CheckpointError, RunFolderError
from ..state.checkpoint import checkpoint_root, checkpoint_step, load_checkpoint, read_marker, resolve_resume
from ..state.run_folder import checkpoint_run_folder, listing
from ..watchdog import watch_run
from .schedules import scheduler_ticks_per_optimizer_step, warmup_then_decay

if TYPE_CHECKING:
    from .trainer import GANTrainer


def open_run(trainer: "GANTrainer", resume_from: Any, fork: bool) -> Path | None:
    """Collective. Take the folder's lock, then start, continue or resume the run; returns the checkpoint resumed."""
    acc, cfg, folder = trainer.accelerator, trainer.config, trainer.run_folder
    watch_run(trainer)  # what an interruption or a silent process reports: this run's step and checkpoints
    run_together(acc, trainer.lock.acquire, main_only=True)
    if resume_from is None:
        if not trainer.fit_calls:  # a second fit() of one trainer continues its own run: nothing to check
            run_together(acc, lambda: _start(trainer, event="start"), main_only=True)
        run_together(acc, lambda: folder.write_description(cfg, trainer.fixed_latents, trainer.step, trainer.fixed_labels), main_only=True)
        return None

    path = run_together(acc, lambda: resolve_resume(resume_from, cfg.output_dir))
    marker = read_marker(path)
    owner = checkpoint_run_folder(path)
    # Checkpoints from before run ids existed are judged by where they lie.
    own = marker.get("run_id") == folder.run_id if marker.get("run_id") is not None else \
        owner == trainer.output_dir.resolve()
    if not own and not fork:
        raise RunFolderError(
            f"checkpoint {path} belongs to the run in {owner}, not to output_dir {trainer.output_dir}: resume it "
            f"with output_dir={str(owner)!r} (--output-dir {owner}), or copy it into a new run folder with "
            "fork=True (--fork)")
    if "config" in marker:  # refuse a changed batch size or loss before loading anything
        _refuse_fixed_changes(path, marker["config"], cfg.to_dict())
    if fork and not own:
        run_together(acc, lambda: _start(trainer, event="fork", source=str(path), step=checkpoint_step(path)),
                     main_only=True)
    state = load_checkpoint(acc, path, acc.process_index)
    if "config" not in marker:  # a checkpoint from before the marker held the config
        _refuse_fixed_changes(path, state["config"], cfg.to_dict())
    trainer.load_state_dict(state)
    _, changes = compare_configs(state["config"], cfg.to_dict())
    notes = apply_changes(trainer, state["config"], changes)
    trainer.resumed_from = trainer.last_checkpoint = path
    trainer.last_checkpoint_step = trainer.step
    if own:
        # From the abandoned folder, the current branch's checkpoint of the same step moves aside too.
        from_root = path.resolve().parent == checkpoint_root(owner).resolve()
        run_together(acc, lambda: _resume(trainer, path, changes, include_step=not from_root), main_only=True)
    elif changes:
        run_together(acc, lambda: folder.log_event("config_change", step=trainer.step, changes=changes), main_only=True)
    run_together(acc, lambda: folder.write_description(cfg, trainer.fixed_latents, trainer.step, trainer.fixed_labels), main_only=True)
    acc.print(f"gan_accel: resumed from {path} at step {trainer.step}")
    for note in notes:
        acc.print(f"gan_accel: {note}")
    return path


def _start(trainer: "GANTrainer", event: str, **fields: Any) -> None:
    folder = trainer.run_folder
    folder.check_new_run(trainer.config.overwrite)
    removed = folder.clear() if trainer.config.overwrite else []
    if removed:
        print(f"gan_accel: overwrite: removed {len(removed)} file(s) the previous run in {folder.path} wrote: "
              f"{listing(removed)}")
        folder.log_event("overwrite", removed=removed)
    trainer.run_id = folder.start()
    folder.log_event(event, run_id=trainer.run_id, config=trainer.config.to_dict(), **fields)


def _resume(trainer: "GANTrainer", path: Path, changes: dict[str, Any], include_step: bool) -> None:
    folder = trainer.run_folder
    folder.adopt()  # a folder from before manifests: its files become the run's own
    trainer.run_id = folder.run_id
    dest, moved = folder.move_aside(trainer.step - 1 if include_step else trainer.step)
    entry: dict[str, Any] = {"step": trainer.step, "checkpoint": str(path)}
    if changes:
        entry["changes"] = changes
    branch = any("checkpoint_" in name for name in moved)  # a later checkpoint was left behind
    if moved:
        entry["moved_aside"] = str(dest)
    if branch:
        print(f"gan_accel: resuming step {trainer.step} starts a branch: the later checkpoints and samples "
              f"were moved to {dest} (nothing was deleted); 'latest' now means this branch")
    folder.log_event("branch" if branch else "resume", **entry)


def _refuse_fixed_changes(path: Path, saved: dict[str, Any], requested: dict[str, Any]) -> None:
    refused, _ = compare_configs(saved, requested)
    if refused:
        raise CheckpointError(
            f"cannot resume {path} with these settings changed ({'; '.join(refused)}): they fix the networks, the "
            "batch or the losses of a run; resume with the checkpoint's values, or start a new run")


def apply_changes(trainer: "GANTrainer", saved: dict[str, Any], changes: dict[str, Any]) -> list[str]:
    """Make the allowed config changes real from this step on; returns what to tell the user.

    The loaded optimizer and scheduler states hold the old rates and betas: set the new base rates
    and betas, and the current rate from the (new) schedule at the current optimizer step. Intervals,
    clipping and penalty weights are read from the config as the run goes, so they apply by themselves.
    """
    schedule_fields = {"lr_G", "lr_D", "betas_G", "betas_D", "max_steps", "warmup_ratio", "lr_schedule"}
    if not schedule_fields & set(changes):
        return []
    cfg, notes = trainer.config, []
    ticks = scheduler_ticks_per_optimizer_step(trainer.accelerator)
    for name in sorted(trainer.built_from_config):
        lr, betas = (cfg.lr_D, cfg.betas_D) if name == "D" else (cfg.lr_G, cfg.betas_G)
        scheduler = trainer.schedulers[name].scheduler
        optimizer = trainer.optimizers[name]
        for index, group in enumerate(optimizer.param_groups):
            scheduler.base_lrs[index] = group["initial_lr"] = lr
            group["betas"] = tuple(betas)
            group["lr"] = lr * scheduler.lr_lambdas[index](scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        if name in ("G", "D"):
            note = _schedule_jump(trainer, name, saved, scheduler.last_epoch // ticks,
                                  scheduler.lr_lambdas[0](scheduler.last_epoch))
            if note:
                notes.append(note)
    changed = ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in sorted(changes.items()))
    notes.insert(0, f"config changed on resume, applied from step {trainer.step} on: {changed}")
    return notes


def _schedule_jump(trainer: "GANTrainer", name: str, saved: dict[str, Any], optimizer_step: int,
                   new_multiplier: float) -> str | None:
    """Say so when the schedule's multiplier at this step differs between the old and new schedule."""
    plan = trainer.runner.plan
    old_total = max(1, plan.scheduler_steps(name, int(saved["max_steps"])))
    schedule = saved.get("lr_schedule", "linear") if name in ("G", "D") else "constant"
    old = warmup_then_decay(old_total, int(float(saved.get("warmup_ratio", 0.1)) * old_total), schedule)(optimizer_step)
    if abs(old - new_multiplier) < 1e-9:
        return None
    return (f"the learning-rate schedule of {name} is recomputed for the new settings: at its optimizer step "
            f"{optimizer_step} its multiplier goes from {old:.4g} to {new_multiplier:.4g} (a jump in the rate); "
            "keep max_steps, warmup_ratio and lr_schedule to continue the old curve")

