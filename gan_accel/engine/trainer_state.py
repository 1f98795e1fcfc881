"""The trainer's own part of a checkpoint (Accelerate's ``save_state`` holds the models, optimizers,
schedulers, sampler and RNG states): counters, data position, metric sums, callbacks, fixed samples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError

if TYPE_CHECKING:
    from .trainer import GANTrainer


def trainer_state(trainer: "GANTrainer") -> dict[str, Any]:
    """This process's state (metric sums and BatchNorm statistics differ between processes)."""
    unwrap = trainer.accelerator.unwrap_model
    return {
        "step": trainer.step, "data": trainer.data.state_dict(), "runner": trainer.runner.state_dict(),
        "means": trainer.means.state_dict(), "guard": trainer.guard.state_dict() if trainer.guard is not None else None,
        "callbacks": trainer.callbacks.state_dict(include_shared=trainer.accelerator.is_main_process), "fixed_latents": trainer.fixed_latents,
        "fixed_labels": trainer.fixed_labels, "config": trainer.config.to_dict(),
        "num_processes": trainer.accelerator.num_processes, "run_id": trainer.run_id,
        # Accelerate saves the main process's models only; BatchNorm statistics are per process
        # (broadcast_buffers=False), so each rank keeps its own for an exact continuation.
        "buffers": {name: {k: b.detach().cpu().clone() for k, b in unwrap(net).named_buffers()}
                    for name, net in trainer.networks.items()},
    }


def restore_trainer_state(trainer: "GANTrainer", state: dict[str, Any]) -> None:
    acc = trainer.accelerator
    if state["num_processes"] != acc.num_processes:  # older checkpoints have no marker to check this before
        raise CheckpointError(f"the checkpoint was written by {state['num_processes']} process(es) and this run "
                              f"has {acc.num_processes}: resume with {state['num_processes']}")
    saved, current = set(state["callbacks"]), set(trainer.callbacks.state_dict())
    if saved != current:
        raise CheckpointError(
            f"the checkpoint holds the state of callbacks {sorted(saved)} but this run has {sorted(current)} "
            "(e.g. ema_decay differs): resume with the run's original config")
    trainer.step = int(state["step"])
    trainer.data.load_state_dict(state["data"])
    trainer.runner.load_state_dict(state["runner"])
    trainer.means.load_state_dict(state["means"], acc.device)
    if trainer.guard is not None and state["guard"] is not None:
        trainer.guard.load_state_dict(state["guard"])
    trainer.callbacks.load_state_dict(state["callbacks"])
    trainer.fixed_latents = state["fixed_latents"]
    trainer.fixed_labels = state.get("fixed_labels")
    for name, net in trainer.networks.items():
        for key, buffer in acc.unwrap_model(net).named_buffers():
            buffer.copy_(state["buffers"][name][key])
