"""Crash-safe checkpoints on top of ``accelerator.save_state`` / ``load_state``.

A checkpoint ``<output_dir>/checkpoints/checkpoint_<step>`` holds Accelerate's state (one
``random_states_<rank>.pkl`` per process, so ``save_state`` runs on every rank), the trainer's own state per
process as a safe tree (``gan_accel_state_<rank>.safetensors``) and ``COMPLETE``, written last.

Everything is written to ``.tmp-checkpoint_<step>`` first; once every rank is done, the main process writes
``COMPLETE`` and renames the folder (atomic on one filesystem): a crash leaves at most a ``.tmp-`` folder,
which resume never picks. Before ``load_state`` every file is checked to hold tensors and plain data only
(:func:`gan_accel.storage.pickles.check_checkpoint_files`). Pruning removes only this run's checkpoints (their
``COMPLETE`` names the run id), and of each only the files its ``COMPLETE`` lists.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from accelerate import Accelerator
from safetensors import SafetensorError
from torch import nn

from ..errors import CheckpointError, NonFiniteWeightsError, RunFolderError, UnsafeFileError
from ..processes import raise_together, run_together
from .files import (create_new, first_line, has_link_between, is_write_failure, make_own_folder, remove_entry,
                    remove_tree, write_failure_reason)
from .finite import check_finite, non_finite_tensors
from .layout import (CHECKPOINT_PREFIX, CHECKPOINTS, COMPLETE, EMA_STATE, ENGINE_STATE, RNG_STATE, TMP_PREFIX,
                     checkpoint_name, checkpoint_root, checkpoint_run_folder)
from .pickles import check_checkpoint_files, load_pickle
from .reading import load_safetensors, read_json
from .safe_tree import load_tree, save_tree
from .weights import state_dict_reason

SHARED_STATE = "shared: saved by the main process"  # a callback state that only gan_accel_state_0's file holds
ENGINE_STATE_KEYS = ("step", "callbacks", "config")  # what every reader of an engine state relies on


def read_marker(path: Path, strict: bool = False) -> dict[str, Any]:
    """What ``COMPLETE`` records (step, processes, run id, config, files); {} for a marker that is not a JSON object
    (an empty one: written by an early version). ``strict`` (a resume): a marker that is not empty and not a JSON
    object raises :class:`CheckpointError` naming it, instead of resuming without its checks."""
    try:
        marker = read_json(path / COMPLETE) if os.path.getsize(path / COMPLETE) else {}
    except (OSError, ValueError, UnsafeFileError) as error:  # a FIFO, a device or a huge file is no marker either
        marker = error
    if strict and not isinstance(marker, dict):
        why = "not a JSON object" if not isinstance(marker, BaseException) else first_line(marker)
        raise CheckpointError(f"{path / COMPLETE} is damaged ({why}): the checkpoint cannot be checked before it is "
                              f"loaded; resume from another checkpoint of the run ({_others(path)})")
    return marker if isinstance(marker, dict) else {}


def is_complete(path: Path) -> bool:
    return path.is_dir() and path.name.startswith(CHECKPOINT_PREFIX) and (path / COMPLETE).is_file()


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first (partial ``.tmp-`` folders are ignored)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if is_complete(p)), key=lambda p: p.name)


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_resume(resume: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """``"latest"`` or a path to a checkpoint folder, checked to be complete."""
    if str(resume) == "latest":
        path = latest_checkpoint(output_dir)
        if path is None:
            raise CheckpointError(
                f"--resume latest: no complete checkpoint under {checkpoint_root(output_dir)}; "
                "start without --resume, or point --output-dir at the run to continue"
            )
        return path
    path = Path(resume)
    if not path.exists():
        raise CheckpointError(f"resume path {path} does not exist: pass a checkpoint folder or 'latest'")
    if path.is_dir() and path.name == CHECKPOINTS:
        names = [p.name for p in list_checkpoints(path.parent)]
        raise CheckpointError(
            f"{path} is the folder of a run's checkpoints, not one checkpoint: pass one of them "
            f"({', '.join(names) or 'it holds no complete one'}), or 'latest' (--resume latest) with "
            f"--output-dir {path.parent}")
    if not is_complete(path):
        raise CheckpointError(
            f"{path} is not a complete gan_accel checkpoint (no {COMPLETE} marker: partial or foreign); "
            f"complete ones in this run: {[p.name for p in list_checkpoints(checkpoint_run_folder(path))] or 'none'}"
        )
    return path


def save_checkpoint(accelerator: Accelerator, output_dir: str | os.PathLike, step: int,
                    engine_state: dict[str, Any], keep_last: int, marker: dict[str, Any] | None = None,
                    keep_also: Iterable[str | os.PathLike] = (),
                    published: Callable[[Path], None] | None = None) -> Path:
    """Collective: call on every rank. Returns the final folder. Keeps this run's newest ``keep_last`` checkpoints
    and those in ``keep_also`` (the best one). A write failure on any process raises :class:`RunFolderError` on
    every process, naming the path and the reason. ``published(final)`` is called on the main process the moment
    the checkpoint is complete (the agreement after it may still fail, when another process is lost)."""
    root = checkpoint_root(output_dir)
    final = root / checkpoint_name(step)
    tmp = root / f"{TMP_PREFIX}{final.name}"

    run_id = (marker or {}).get("run_id")

    def prepare() -> None:
        if accelerator.is_main_process:
            if os.path.lexists(final):
                raise RunFolderError(f"cannot write checkpoint {final}: that folder exists, and a run never replaces "
                                     "a checkpoint; move it away, then resume")
            if os.path.lexists(tmp):  # this run's save of this step, cut short by a crash (a link: only the link)
                remove_tree(tmp)
            make_own_folder(root, "the run's checkpoints")  # never into a folder a link points to

    def write_own_files() -> None:
        accelerator.save_state(str(tmp))
        save_tree(engine_state, tmp / ENGINE_STATE.format(rank=accelerator.process_index))

    def publish() -> None:
        if accelerator.is_main_process:
            meta = {"step": step, "num_processes": accelerator.num_processes, **(marker or {}), "files": _files_in(tmp)}
            _write_synced(tmp / COMPLETE, json.dumps(meta))
            os.replace(tmp, final)
            if published is not None:
                published(final)
            _fsync_dir(root)
            protected = {Path(p).name for p in keep_also}
            for old in [p for p in list_checkpoints(output_dir) if written_by(p, run_id)][:-keep_last]:
                if old.name not in protected:
                    _prune(old)

    # Each part ends in an agreement instead of a bare barrier: every rank's files are on disk before
    # COMPLETE is written, and a rank that cannot write stops every rank, not only itself.
    for part in (prepare, write_own_files, publish):
        raise_together(accelerator, _as_write_error(part, tmp))
    return final


def written_by(checkpoint: Path, run_id: str | None) -> bool:
    """Whether ``checkpoint`` was written by the run ``run_id`` (its ``COMPLETE`` says so), and is no link."""
    return not checkpoint.is_symlink() and read_marker(checkpoint).get("run_id") == run_id


def _prune(checkpoint: Path) -> None:
    """Remove an old checkpoint of this run: ``COMPLETE`` first (from then on the folder is no checkpoint), then
    the files it lists as the save's, then the folders left empty. Anything else in it stays, and nothing is
    removed through a link: a listed file below a linked folder is left alone, a listed link goes itself."""
    listed = read_marker(checkpoint).get("files")
    try:
        (checkpoint / COMPLETE).unlink()
        for name in listed if isinstance(listed, list) else []:
            if isinstance(name, str) and ".." not in Path(name).parts and not Path(name).is_absolute() \
                    and not has_link_between(checkpoint, Path(name).parent):
                remove_entry(checkpoint / name)
        for folder in sorted((d for d, _, _ in os.walk(checkpoint)), reverse=True):  # the deepest first; no links
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only ever an empty folder
    except OSError as error:  # pruning is housekeeping: the new checkpoint is complete, the old one stays
        print(f"gan_accel: could not remove the old checkpoint {checkpoint} ({write_failure_reason(error)}); "
              "remove it yourself if you need the space")


def _files_in(folder: Path) -> list[str]:
    """Every file under ``folder``, relative to it (what a checkpoint's COMPLETE lists as written by the save)."""
    return sorted(Path(d, name).relative_to(folder).as_posix() for d, _, files in os.walk(folder) for name in files)


def _as_write_error(part: Any, tmp: Path) -> BaseException | None:
    try:
        part()
    except Exception as error:
        if not is_write_failure(error):
            return error
        where = getattr(error, "filename", None) or tmp
        return RunFolderError(f"cannot write checkpoint {where}: {write_failure_reason(error, tmp)}")
    return None


def load_checkpoint(accelerator: Accelerator, path: Path, rank: int) -> dict[str, Any]:
    """Collective: restores Accelerate's state on every rank and returns this rank's engine state.

    Raises :class:`CheckpointError` with the reason when the checkpoint does not fit.
    """
    saved_processes = read_marker(path).get("num_processes")
    if saved_processes is not None and saved_processes != accelerator.num_processes:
        # Every rank reads the same marker, so every rank refuses: none is left waiting in load_state.
        raise CheckpointError(
            f"{path} was written by {saved_processes} process(es) and this run has {accelerator.num_processes}: "
            f"the batch per step, the data order and the noise depend on it; resume with {saved_processes} "
            f"(accelerate launch --num_processes {saved_processes}), or start a new run")

    def read() -> dict[str, Any]:
        if engine_state_file(path, rank) is None:
            if saved_processes is not None:  # written by as many processes as this run has: a file is gone
                raise CheckpointError(
                    f"{path} is damaged: its engine state for process {rank} ({ENGINE_STATE.format(rank=rank)}) is "
                    f"missing (deleted, or the checkpoint was copied in part); resume from another checkpoint of the "
                    f"run ({_others(path)})")
            raise CheckpointError(
                f"{path} has no engine state for process {rank}: it was saved with fewer processes, or the file was "
                f"deleted; resume with the number of processes that wrote it, or from another checkpoint "
                f"({_others(path)})")
        try:  # before load_state: no file is unpickled beyond tensors and plain data
            check_checkpoint_files(path)
        except UnsafeFileError as error:
            raise UnsafeFileError(f"{error}; resume from another checkpoint of the run ({_others(path)})") from None
        engine_state = _with_shared_states(path, read_engine_state(path, rank), rank)
        check_weights_finite(path, engine_state, rank)
        return engine_state

    # Agreed: a file only one process reads (its engine state) must not leave the others waiting in load_state.
    engine_state = run_together(accelerator, read)
    try:
        accelerator.load_state(str(path))
    except Exception as error:  # safetensors, pickle and load_state_dict errors have no common base
        hint = " (a model of another shape or width?)" if "size mismatch" in str(error) or "Missing key" in str(error) else ""
        raise CheckpointError(f"cannot restore {path}{hint}: {state_dict_reason(error)}") from error
    check_rng_restored(accelerator, path)
    return engine_state


def check_weights_finite(path: Path, engine_state: dict[str, Any], rank: int) -> None:
    """Refuse a checkpoint whose networks' weights (Accelerate's ``model*.safetensors``) or EMA of G hold NaN or
    inf, naming the file and the tensor: resumed, they would diverge at once and the blame fall elsewhere."""
    try:
        for file in sorted(path.glob("model*.safetensors")):
            try:
                tensors = load_safetensors(file)
            except (SafetensorError, OSError, ValueError) as error:  # truncated or foreign
                raise CheckpointError(f"cannot read {file} (truncated or corrupt?): {first_line(error)}; resume from "
                                      f"another checkpoint of the run ({_others(path)})") from None
            check_finite(tensors, file)
        average = engine_state.get("callbacks", {}).get(EMA_STATE)
        if isinstance(average, dict) and isinstance(average.get("module"), dict):
            check_finite(average["module"], path / ENGINE_STATE.format(rank=rank), "the EMA of G's tensor")
    except NonFiniteWeightsError as error:
        raise NonFiniteWeightsError(f"{error} ({_others(path)})") from None


def _others(path: Path) -> str:
    """The run's other complete checkpoints, for messages."""
    names = [p.name for p in list_checkpoints(checkpoint_run_folder(path)) if p.name != path.name]
    return "complete ones: " + ", ".join(names) if names else "it has no other complete one"


def _with_shared_states(path: Path, engine_state: dict[str, Any], rank: int) -> dict[str, Any]:
    """Fill in the callback states that only the main process's file holds (e.g. the EMA: one copy)."""
    callbacks = engine_state.get("callbacks", {})
    shared = [name for name, state in callbacks.items() if isinstance(state, str) and state == SHARED_STATE]
    if shared and rank != 0:
        main_state = read_engine_state(path, 0)
        missing = [name for name in shared if name not in main_state["callbacks"]]
        if missing:
            raise CheckpointError(f"{engine_state_file(path, 0)} lacks the state of callback(s) {missing} that the other "
                                  "processes' files point to: the checkpoint was damaged; resume from another one")
        for name in shared:
            callbacks[name] = main_state["callbacks"][name]
    return engine_state


def engine_state_file(path: Path, rank: int) -> Path | None:
    """The engine state of process ``rank`` in checkpoint ``path``, or None when there is none."""
    file = path / ENGINE_STATE.format(rank=rank)
    return file if os.path.lexists(file) else None


def read_engine_state(path: Path, rank: int) -> dict[str, Any]:
    """Process ``rank``'s engine state in checkpoint ``path``, read without running code. Raises
    :class:`CheckpointError` in one line naming the file when there is none, or it is unsafe, corrupt or not one."""
    file = engine_state_file(path, rank)
    if file is None:
        raise CheckpointError(f"{path} has no {ENGINE_STATE.format(rank=rank)} (the engine state of process {rank})")
    state = load_tree(file)
    missing = [key for key in ENGINE_STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing or not isinstance(state["callbacks"], dict) or not isinstance(state["config"], dict):
        what = f"it lacks {missing}" if missing else "its callbacks or config is not a dict"
        raise CheckpointError(f"{file} is not a gan_accel engine state ({what}): the checkpoint was damaged or "
                              "written by something else; resume from another checkpoint")
    return state


def check_rng_restored(accelerator: Accelerator, path: Path) -> None:
    """Accelerate only logs (at INFO) when it cannot restore RNG states: verify it ourselves."""
    rng_file = path / RNG_STATE.format(rank=accelerator.process_index)
    if not rng_file.is_file():
        raise CheckpointError(
            f"{path} has no RNG state for process {accelerator.process_index}: it was saved with fewer "
            "processes, or the file was deleted; resume with the same number of processes for an exact "
            f"continuation, or from another checkpoint ({_others(path)})"
        )
    saved = load_pickle(rng_file, numpy=True)  # the allow-list Accelerate loads it with: never more
    if not isinstance(saved, dict) or not isinstance(saved.get("torch_manual_seed"), torch.Tensor):
        raise CheckpointError(f"{rng_file} holds no torch RNG state (torch_manual_seed): the checkpoint was damaged; "
                              "resume from another one")
    for key, value in saved.items():  # torch_manual_seed (the CPU), torch_<device>_manual_seed (a list for CUDA)
        if not (key.startswith("torch_") and key.endswith("_manual_seed")):
            continue
        device = key[len("torch_"):-len("_manual_seed")]
        module = getattr(torch, device, None) if device else torch
        if device and (module is None or not hasattr(module, "is_available") or not module.is_available()):
            continue  # saved on a device this machine lacks: nothing to restore it into
        several = isinstance(value, (list, tuple))
        live = module.get_rng_state_all() if several else [module.get_rng_state()]
        if any(not isinstance(s, torch.Tensor) or not torch.equal(s.cpu(), l.cpu())
               for s, l in zip(value if several else [value], live)):
            raise CheckpointError(f"the {device or 'torch'} RNG state of process {accelerator.process_index} was not "
                                  f"restored from {rng_file}")


def parameters_finite(*models: nn.Module) -> bool:
    """Whether every parameter and buffer of the models is finite (used before writing a checkpoint)."""
    tensors = [t for m in models for t in (*m.parameters(), *m.buffers()) if t.is_floating_point()]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def non_finite_parts(networks: dict[str, nn.Module], unwrap: Any = None) -> list[str]:
    """What holds NaN/inf values, in words: ``["D's buffers net.1.running_mean, net.1.running_var"]``,
    ``["G's weights (3 tensors: net.0.weight, ...)"]``; empty if everything is finite. Reads every tensor."""
    parts = []
    for name, net in networks.items():
        module = unwrap(net) if unwrap is not None else net
        for kind, tensors in (("weights", module.named_parameters()), ("buffers", module.named_buffers())):
            bad = [key for key, _, _ in non_finite_tensors(dict(tensors))]
            if bad:
                shown = ", ".join(bad[:4]) + (f", ... ({len(bad)} in all)" if len(bad) > 4 else "")
                parts.append(f"{name}'s {kind} {shown}")
    return parts


def _write_synced(path: Path, text: str) -> None:
    with os.fdopen(create_new(path), "w") as handle:  # a new file in the save's own folder, never through a link
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    if os.name == "nt":  # Windows opens no folder as a file; NTFS journals the rename itself
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
