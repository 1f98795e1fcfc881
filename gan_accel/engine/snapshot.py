"""The trainer's snapshot: its own part of a checkpoint (Accelerate's ``save_state`` holds the models,
optimizers, schedulers, sampler and RNG states): counters, data position, metric sums, callbacks, fixed samples.

:func:`take_snapshot` reads a trainer (``GANTrainer.state_dict``); :func:`restore_snapshot` puts one back
(``GANTrainer.load_state_dict``), after :func:`check_restorable` has refused one that cannot continue this run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..errors import CheckpointError, GanAccelError

if TYPE_CHECKING:
    from .trainer import GANTrainer


def take_snapshot(trainer: "GANTrainer") -> dict[str, Any]:
    """This process's state (metric sums and BatchNorm statistics differ between processes)."""
    unwrap = trainer.accelerator.unwrap_model
    return {
        "step": trainer.state.step, "data": trainer.data.state_dict(), "runner": trainer.runner.state_dict(),
        "means": trainer.means.state_dict(), "guard": trainer.guard.state_dict() if trainer.guard is not None else None,
        "callbacks": trainer.callbacks.state_dict(include_shared=trainer.accelerator.is_main_process), "fixed_latents": trainer.fixed_latents,
        "fixed_labels": trainer.fixed_labels, "config": trainer.config.to_dict(),
        "num_processes": trainer.accelerator.num_processes, "run_id": trainer.state.run_id,
        # Accelerate saves the main process's models only; BatchNorm statistics are per process
        # (broadcast_buffers=False), so each rank keeps its own for an exact continuation.
        "buffers": {name: {k: b.detach().cpu().clone() for k, b in unwrap(net).named_buffers()}
                    for name, net in trainer.networks.items()},
    }


def check_restorable(state: Mapping[str, Any], num_processes: int, callback_states: Iterable[str]) -> None:
    """Refuse, in one line, a state written by another number of processes or with other stateful callbacks."""
    if state["num_processes"] != num_processes:  # older checkpoints have no marker to check this before
        raise CheckpointError(f"the checkpoint was written by {state['num_processes']} process(es) and this run "
                              f"has {num_processes}: resume with {state['num_processes']}")
    saved = set(state["callbacks"])
    current = set(callback_states)
    if saved != current:
        raise CheckpointError(
            f"the checkpoint holds the state of callbacks {sorted(saved)} but this run has {sorted(current)} "
            "(e.g. ema_decay differs): resume with the run's original config")


def restore_checked(trainer: "GANTrainer", state: Mapping[str, Any], checkpoint: Any) -> None:
    """``trainer.load_state_dict(state)`` for a resume; a state that is well formed but does not hold what this run needs (a
    damaged or hand-made file: a key missing, a value of another type) is refused in one line naming the checkpoint."""
    try:
        trainer.load_state_dict(state)
    except GanAccelError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as error:
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise CheckpointError(f"the engine state in {checkpoint} does not fit this run ({type(error).__name__}: {text}): "
                              "it was damaged or written by something else; resume from another checkpoint") from error


def restore_snapshot(trainer: "GANTrainer", state: Mapping[str, Any]) -> None:
    """Put back :func:`take_snapshot`'s state (this process's), after checking it can continue this run."""
    check_restorable(state, trainer.accelerator.num_processes, trainer.callbacks.state_dict())
    trainer.state.step = int(state["step"])
    trainer.data.load_state_dict(state["data"])
    trainer.runner.load_state_dict(state["runner"])
    trainer.means.load_state_dict(state["means"], trainer.accelerator.device)
    if trainer.guard is not None and state["guard"] is not None:
        trainer.guard.load_state_dict(state["guard"])
    trainer.callbacks.load_state_dict(state["callbacks"])
    trainer.fixed_latents, trainer.fixed_labels = state["fixed_latents"], state.get("fixed_labels")
    for name, net in trainer.networks.items():  # each network's buffers (BatchNorm statistics), in place
        for key, buffer in trainer.accelerator.unwrap_model(net).named_buffers():
            buffer.copy_(state["buffers"][name][key])
