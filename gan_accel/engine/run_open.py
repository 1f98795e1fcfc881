"""Opening the run folder at the start of ``fit``: a new run or a resume, and what the history records.

Every rule here keeps data: a new run never starts over another one unless asked, and then removes
only the files that run recorded; a checkpoint is resumed only into the folder that wrote it unless
forked; resuming an older checkpoint moves the newer ones aside (a branch); a config change on
resume is refused or applied for real, and dated.

These functions take what they need and return what they decided; the trainer (``GANTrainer._open``)
calls them on the right processes and is the one that changes its own state. Checks read the same
files on every rank, so every process reaches the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..config import TrainConfig, compare_configs
from ..errors import CheckpointError, RunFolderError
from ..state.checkpoint import read_marker, resolve_resume
from ..state.layout import checkpoint_root, checkpoint_run_folder
from ..state.paths import output_dir_refusal
from ..state.run_folder import RunFolder, listing
from .phases import PhasePlan
from .schedules import warmup_then_decay


@dataclass(frozen=True)
class ResumeTarget:
    """A checkpoint chosen for ``fit(resume_from=...)``: where it is, and whether this run folder wrote it."""

    path: Path
    owner: Path  # the run folder the checkpoint belongs to
    own: bool  # written by the run in this output folder (else a fork)


def check_output_dir(path: Path) -> None:
    """Main process, before anything is written: refuse an ``output_dir`` in a folder another run manages
    (its ``checkpoints/`` or ``trackers/``), in one line naming that run (see :mod:`gan_accel.state.paths`)."""
    why = output_dir_refusal(path)
    if why is not None:
        raise RunFolderError(why)


def start_run(folder: RunFolder, config: TrainConfig, event: str, **fields: Any) -> str:
    """Main process: check the folder, clear the previous run if ``overwrite`` asks, start a manifest and
    log ``event`` (``"start"`` or ``"fork"``); returns the new run's id."""
    folder.check_new_run(config.overwrite)
    removed, refused = folder.clear() if config.overwrite else ([], [])
    run_id = folder.start()
    folder.repair_tails()  # the history survives an overwrite: a line a crash cut short is repaired first
    if removed:
        print(f"gan_accel: overwrite: removed {len(removed)} file(s) the previous run in {folder.path} wrote: "
              f"{listing(removed)}")
    if refused:
        print(f"gan_accel: overwrite: left {len(refused)} manifest entr{'y' if len(refused) == 1 else 'ies'} "
              f"in place (in whole or in part), not files of the run inside {folder.path}: {'; '.join(refused[:6])}"
              + (f"; and {len(refused) - 6} more (see history.jsonl)" if len(refused) > 6 else ""))
    if removed or refused:
        folder.log_event("overwrite", removed=removed, **({"left": refused} if refused else {}))
    folder.log_event(event, run_id=run_id, config=config.to_dict(), **fields)
    return run_id


def choose_checkpoint(resume_from: Any, config: TrainConfig, folder: RunFolder, fork: bool) -> ResumeTarget:
    """Every process: the checkpoint to resume, refused in one line when it belongs to another run (without
    ``fork``) or when its config differs in a field a run cannot change."""
    path = resolve_resume(resume_from, config.output_dir)
    marker = read_marker(path)
    owner = checkpoint_run_folder(path)
    here = owner == Path(config.output_dir).resolve()
    # Checkpoints from before run ids existed, and run folders whose manifest is gone, are judged by where
    # the checkpoint lies (the resume then writes a manifest with the checkpoint's run id).
    own = marker.get("run_id") == folder.run_id if marker.get("run_id") is not None and folder.run_id is not None \
        else here
    if not own and not fork:
        if here:  # in this folder, but written by another run than the one its manifest names
            raise RunFolderError(
                f"checkpoint {path} was written by run {marker.get('run_id')}, but the run in {owner} is "
                f"{folder.run_id} (its manifest.json): copied in from another run? Resume this run from its own "
                "checkpoints (--resume latest), or start a new run from this one in another folder with fork=True "
                "(--fork --output-dir NEW)")
        raise RunFolderError(
            f"checkpoint {path} belongs to the run in {owner}, not to output_dir {config.output_dir}: resume it "
            f"with output_dir={str(owner)!r} (--output-dir {owner}), or copy it into a new run folder with "
            "fork=True (--fork)")
    if "config" in marker:  # refuse a changed batch size or loss before loading anything
        refuse_fixed_changes(path, marker["config"], config.to_dict())
    return ResumeTarget(path, owner, own)


def record_resume(folder: RunFolder, target: ResumeTarget, step: int, changes: Mapping[str, Any]) -> str:
    """Main process, after a resume of the run's own checkpoint: move what was written after it aside
    (a branch) and log the resume; returns the run's id."""
    folder.adopt(read_marker(target.path).get("run_id"))  # no manifest (older, or deleted): the files become the run's
    folder.repair_tails()  # a metrics row or history line a crash cut short: repaired once, kept aside
    # From the abandoned folder, the current branch's checkpoint of the same step moves aside too.
    from_root = target.path.resolve().parent == checkpoint_root(target.owner).resolve()
    dest, moved = folder.move_aside(step if from_root else step - 1)
    entry: dict[str, Any] = {"step": step, "checkpoint": str(target.path)}
    if changes:
        entry["changes"] = dict(changes)
    branch = any("checkpoint_" in name for name in moved)  # a later checkpoint was left behind
    if moved:
        entry["moved_aside"] = str(dest)
    if branch:
        print(f"gan_accel: resuming step {step} starts a branch: the later checkpoints and samples "
              f"were moved to {dest} (nothing was deleted); 'latest' now means this branch")
    folder.log_event("branch" if branch else "resume", **entry)
    return folder.run_id


def refuse_fixed_changes(path: Path, saved: dict[str, Any], requested: dict[str, Any]) -> None:
    refused, _ = compare_configs(saved, requested)
    if refused:
        raise CheckpointError(
            f"cannot resume {path} with these settings changed ({'; '.join(refused)}): they fix the networks, the "
            "batch or the losses of a run; resume with the checkpoint's values, or start a new run")


def apply_schedule_changes(config: TrainConfig, saved: dict[str, Any], changes: Mapping[str, Any],
                           plan: PhasePlan, optimizers: Mapping[str, Any], schedulers: Mapping[str, Any],
                           built_from_config: frozenset[str], ticks: int, step: int) -> list[str]:
    """Make the allowed config changes real from this step on; returns what to tell the user.

    The loaded optimizer and scheduler states hold the old rates and betas: set the new base rates
    and betas, and the current rate from the (new) schedule at the current optimizer step. Intervals,
    clipping and penalty weights are read from the config as the run goes, so they apply by themselves.
    """
    schedule_fields = {"lr_G", "lr_D", "betas_G", "betas_D", "max_steps", "warmup_ratio", "lr_schedule"}
    if not schedule_fields & set(changes):
        return []
    notes = []
    for name in sorted(built_from_config):
        lr, betas = (config.lr_D, config.betas_D) if name == "D" else (config.lr_G, config.betas_G)
        scheduler = schedulers[name].scheduler
        for index, group in enumerate(optimizers[name].param_groups):
            scheduler.base_lrs[index] = group["initial_lr"] = lr
            group["betas"] = tuple(betas)
            group["lr"] = lr * scheduler.lr_lambdas[index](scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in optimizers[name].param_groups]
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
    schedule = saved.get("lr_schedule", "linear") if name in ("G", "D") else "constant"
    old = warmup_then_decay(old_total, int(float(saved.get("warmup_ratio", 0.1)) * old_total), schedule)(optimizer_step)
    if abs(old - new_multiplier) < 1e-9:
        return None
    return (f"the learning-rate schedule of {name} is recomputed for the new settings: at its optimizer step "
            f"{optimizer_step} its multiplier goes from {old:.4g} to {new_multiplier:.4g} (a jump in the rate); "
            "keep max_steps, warmup_ratio and lr_schedule to continue the old curve")
