"""Opening the run folder at the start of ``fit``: a new run, the run continued, or a fork.

One run per folder, only forward (:mod:`gan_accel.storage.run_folder`): ``resume_from=None`` starts a new run
in an absent or empty folder, or in one whose run was killed before its first checkpoint (what it wrote is replaced:
:mod:`gan_accel.storage.restart`); ``"latest"`` continues in place; ``"auto"`` is ``"latest"`` when the folder holds
a complete checkpoint and ``None`` otherwise when a new run may start there (one command for a first start and every
requeue); any other checkpoint forks a new run into such a folder (an older checkpoint of ``output_dir`` itself is
refused). A config change on resume is refused or applied for real, and dated in the history. :func:`open_run` is
what ``fit`` calls; checks read the same files on every rank, so every process reaches the same decision."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..config import TrainConfig, compare_configs
from ..errors import CheckpointError, RunFolderError
from ..processes import main_decides, run_together
from ..storage.checkpoint import latest_checkpoint, load_checkpoint, read_marker, resolve_resume
from ..storage.layout import HISTORY, checkpoint_root
from ..storage.restart import clear_killed_attempt, killed_attempt, name_some
from ..storage.run_folder import check_new_run, holds_run, log_event, output_dir_refusal, write_description
from .phases import PhasePlan
from .schedules import first_value, scheduler_ticks_per_optimizer_step, set_base_lr, set_betas, warmup_then_decay
from .snapshot import restore_checked

if TYPE_CHECKING:
    from .trainer import GANTrainer


def resume_note(last_checkpoint: Path | None, crashed: bool = False) -> str:
    """Where a run can be resumed from, for error messages; ``crashed``: it did not end as planned (killed, a lost
    process), so without a checkpoint the same command starts it again (:mod:`gan_accel.storage.restart`)."""
    if last_checkpoint is None and crashed:
        return "No checkpoint of this run was written: the same command starts it again, replacing what it wrote."
    if last_checkpoint is None:
        return ("No checkpoint of this run was written, so there is nothing to resume: start it again in "
                "another output folder (gan-accel never deletes a run).")
    return (f"The last complete checkpoint is {last_checkpoint}; resume with --resume latest "
            "(fit(resume_from='latest')) and the same output folder.")


def open_run(trainer: "GANTrainer", resume_from: Any) -> None:
    """Collective, at the start of ``fit``: take the folder's lock, then start, continue or fork the run."""
    acc, cfg, state, out = trainer.accelerator, trainer.config, trainer.state, trainer.output_dir
    run_together(acc, lambda: check_output_dir(out), main_only=True)
    if resume_from is None and not trainer.fit_calls:  # checked again under the lock; first so a refusal writes nothing
        run_together(acc, lambda: check_new_run(out), main_only=True)
    run_together(acc, trainer.lock.acquire, main_only=True)
    if str(resume_from) != "latest" and not trainer.fit_calls:
        restarted = run_together(acc, lambda: restart_killed(out, trainer.lock.previous, resume_from), main_only=True)
        if restarted:
            acc.print(f"gan_accel: {restarted}")
    if str(resume_from) == AUTO:  # decided once, under the lock, by the main process for all of them
        resume_from = main_decides(acc, lambda: resolve_auto(out))
        if resume_from is None:
            acc.print(f"gan_accel: --resume auto: no checkpoint in {out} yet, so a new run starts there")
    describe = lambda: write_description(out, cfg, trainer.fixed_latents, trainer.fixed_labels)  # noqa: E731
    if resume_from is None:
        if not trainer.fit_calls:  # a second fit() of one trainer continues its own run
            state.run_id = run_together(acc, lambda: start_run(out, cfg), main_only=True)
        trainer.lock.previous = None  # the folder is this run's now: an earlier holder's record is not kept
        run_together(acc, describe, main_only=True)
        return
    target = run_together(acc, lambda: choose_checkpoint(resume_from, cfg))
    saved = load_checkpoint(acc, target.path, acc.process_index)
    restore_checked(trainer, saved, target.path)
    _, changes = compare_configs(saved["config"], cfg.to_dict())
    notes = apply_schedule_changes(cfg, saved["config"], changes, trainer.runner.plan, trainer.optimizers,
                                   trainer.schedulers, trainer.built_from_config,
                                   scheduler_ticks_per_optimizer_step(acc), state.step)
    state.resumed_from = target.path
    if target.continued:  # a fork writes its first checkpoint into its own folder
        state.last_checkpoint, state.last_checkpoint_step = target.path, state.step
    state.run_id = run_together(acc, lambda: record_resume(out, target, state.step, cfg, changes), main_only=True)
    trainer.lock.previous = None
    run_together(acc, describe, main_only=True)
    acc.print(f"gan_accel: resumed from {target.path} at step {state.step}"
              + ("" if target.continued else f", as a new run in {out}"))
    for note in notes:
        acc.print(f"gan_accel: {note}")


AUTO = "auto"


def resolve_auto(output_dir: str | Path) -> str | None:
    """``resume_from="auto"``: ``"latest"`` when ``output_dir`` holds a complete checkpoint (a run killed between
    checkpoints, even mid-save, goes on from its newest complete one), ``None`` (a new run) when it is absent, empty
    or holds a run killed before its first checkpoint. Another folder that holds a run but no complete checkpoint is
    refused in one line: there is nothing to go on from, and a new run never lands on another."""
    output_dir = Path(output_dir)
    if latest_checkpoint(output_dir) is not None:
        return "latest"
    try:
        check_new_run(output_dir)
        return None
    except RunFolderError as error:
        if not output_dir.is_dir() or killed_attempt(output_dir) is not None:
            raise RunFolderError(f"--resume auto: {error}") from None
    what = "holds a run that wrote no complete checkpoint (it stopped before its first)" if holds_run(output_dir) \
        else "is not empty and holds no gan_accel checkpoint"
    raise RunFolderError(f"--resume auto: {output_dir} {what}, so there is nothing to continue and no new run may "
                         "start there; move it away or choose another --output-dir (gan-accel never deletes a run)")


def restart_killed(output_dir: Path, holder: dict[str, Any] | None, resume_from: Any) -> str | None:
    """Main process, under the lock: when ``output_dir`` holds a run killed before its first checkpoint, replace
    what it wrote and log it (a checkpoint to fork from is checked first); the line to print, or None."""
    if holder is None:
        return None
    if resume_from not in (None, AUTO):
        resolve_resume(resume_from, output_dir)  # refused before anything is removed
    removed = clear_killed_attempt(output_dir, holder)
    if not removed:
        return None
    log_event(output_dir, "restart", killed=holder, removed=removed)
    return (f"{output_dir} held a run killed before its first checkpoint (pid {holder.get('pid')} on "
            f"{holder.get('host')}, since {holder.get('since')}): it starts again there, replacing what that run wrote "
            f"({name_some(removed, 4)}); {HISTORY} keeps its record")


@dataclass(frozen=True)
class ResumeTarget:
    """A checkpoint chosen for ``fit(resume_from=...)``: where it is, and whether the run goes on in its folder."""

    path: Path
    continued: bool  # the latest checkpoint of output_dir: the same run goes on (else a fork into output_dir)


def check_output_dir(path: Path) -> None:
    """Main process, before anything is written: refuse an ``output_dir`` inside another run's ``checkpoints/``
    or ``trackers/``, in one line naming that run."""
    why = output_dir_refusal(path)
    if why is not None:
        raise RunFolderError(why)


def start_run(output_dir: Path, config: TrainConfig) -> str:
    """Main process: refuse a folder that is not absent or empty, then log the start of a new run there;
    returns its new id."""
    check_new_run(output_dir)
    run_id = uuid.uuid4().hex
    log_event(output_dir, "start", run_id=run_id, config=config.to_dict())
    return run_id


def choose_checkpoint(resume_from: Any, config: TrainConfig) -> ResumeTarget:
    """Every process: :func:`resume_target`, and a config that differs in a field a run cannot change refused."""
    target = resume_target(resume_from, config.output_dir)
    marker = read_marker(target.path, strict=True)
    if "config" in marker:  # refuse a changed batch size or loss before loading anything
        refuse_fixed_changes(target.path, marker["config"], config.to_dict())
    return target


def resume_target(resume_from: Any, output_dir: str | Path) -> ResumeTarget:
    """The checkpoint to resume and whether it continues ``output_dir``'s run or forks a new one; refused in
    one line for an older checkpoint of ``output_dir`` or a fork into a folder that holds a run."""
    output_dir = Path(output_dir)
    path = resolve_resume(resume_from, output_dir)
    latest = latest_checkpoint(output_dir)
    if str(resume_from) == "latest" or (latest is not None and path.resolve() == latest.resolve()):
        continued = True
    elif path.resolve().parent == checkpoint_root(output_dir).resolve():
        raise RunFolderError(
            f"{path} is an older checkpoint of the run in {output_dir}, which has gone on to {latest.name}: a run "
            f"only moves forward; continue it with `--resume latest`, or start a new run from {path.name} in a new "
            f"folder (`--resume {path} --output-dir NEW`)")
    else:
        continued = False
        try:
            check_new_run(output_dir)
        except RunFolderError as error:
            raise RunFolderError(f"resuming {path} starts a new run from it, in --output-dir: {error}") from None
    return ResumeTarget(path, continued)


def record_resume(output_dir: Path, target: ResumeTarget, step: int, config: TrainConfig,
                  changes: Mapping[str, Any]) -> str:
    """Main process: log the resume (the same run) or the fork (a new run from another checkpoint) in the
    history, with the config changes; returns the run's id (the checkpoint's, or a new one for a fork)."""
    extra = {"changes": dict(changes)} if changes else {}
    if target.continued:
        run_id = read_marker(target.path).get("run_id") or uuid.uuid4().hex
        log_event(output_dir, "resume", run_id=run_id, step=step, checkpoint=str(target.path), **extra)
    else:
        run_id = uuid.uuid4().hex
        log_event(output_dir, "fork", run_id=run_id, step=step, source=str(target.path), config=config.to_dict(),
                  **extra)
    return run_id


def refuse_fixed_changes(path: Path, saved: dict[str, Any], requested: dict[str, Any]) -> None:
    refused, _ = compare_configs(saved, requested)
    if refused:
        raise CheckpointError(
            f"cannot resume {path} with these settings changed ({'; '.join(refused)}): they fix the networks, the "
            "batch or the losses of a run; resume with the checkpoint's values, or start a new run")


def apply_schedule_changes(config: TrainConfig, saved: dict[str, Any], changes: Mapping[str, Any],
                           plan: PhasePlan, optimizers: Mapping[str, Any], schedulers: Mapping[str, Any],
                           built_from_config: frozenset[str], ticks: int, step: int) -> list[str]:
    """Make the allowed config changes real from this step on (the loaded optimizer and scheduler states hold
    the old rates and betas; other fields are read as the run goes); returns what to tell the user."""
    schedule_fields = {"lr_G", "lr_D", "betas_G", "betas_D", "max_steps", "warmup_ratio", "lr_schedule"}
    if not schedule_fields & set(changes):
        return []
    notes = []
    for name in sorted(built_from_config):
        lr, betas = (config.lr_D, config.betas_D) if name == "D" else (config.lr_G, config.betas_G)
        scheduler, groups = schedulers[name].scheduler, optimizers[name].param_groups
        for group in groups:  # a Ramp's first value: StepRamps sets it anew before each step
            group["initial_lr"] = first_value(lr)
        set_base_lr(first_value(lr), scheduler, groups)
        set_betas(betas, 0, groups)
        if name in ("G", "D"):
            note = _schedule_jump(plan, name, saved, scheduler.last_epoch // ticks,
                                  scheduler.lr_lambdas[0](scheduler.last_epoch))
            if note:
                notes.append(note)
    changed = ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in sorted(changes.items()))
    return [f"config changed on resume, applied from step {step} on: {changed}", *notes]


def _schedule_jump(plan: PhasePlan, name: str, saved: dict[str, Any], optimizer_step: int,
                   new_multiplier: float) -> str | None:
    """Say so when the schedule's multiplier at this step differs between the old and new schedule."""
    old_total = max(1, plan.scheduler_steps(name, int(saved["max_steps"])))
    schedule = saved.get("lr_schedule", "linear")  # G's or D's: an extra network's schedule is constant
    old = warmup_then_decay(old_total, int(float(saved.get("warmup_ratio", 0.1)) * old_total), schedule)(optimizer_step)
    if abs(old - new_multiplier) < 1e-9:
        return None
    return (f"the learning-rate schedule of {name} is recomputed for the new settings: at its optimizer step "
            f"{optimizer_step} its multiplier goes from {old:.4g} to {new_multiplier:.4g} (a jump in the rate); "
            "keep max_steps, warmup_ratio and lr_schedule to continue the old curve")
