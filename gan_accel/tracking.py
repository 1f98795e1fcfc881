"""Which experiment trackers exist, which are installed, and what a run's ``log_with`` resolves to.

Accelerate ships the trackers (TensorBoard, W&B, trackio, MLflow, Aim, Comet, ClearML, DVCLive, SwanLab)
and silently drops one whose package is missing; gan_accel resolves ``TrainConfig.log_with`` here, so
the Accelerator is built with the installed ones and the ``tracker_logger`` callback names the rest.
"""

from __future__ import annotations

from typing import Any, Iterable

# The trackers Accelerate ships; each has a gan_accel extra of the same name (pip install 'gan_accel[mlflow]').
BUILTIN_TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow", "aim", "comet_ml", "clearml", "dvclive", "swanlab")


def tracker_available(name: str) -> bool:
    """Whether ``name``'s package is installed (Accelerate's ``is_<name>_available``); a registered custom tracker is."""
    import accelerate.utils

    check = getattr(accelerate.utils, f"is_{name}_available", None)
    return True if check is None or name not in BUILTIN_TRACKERS else bool(check())


def resolve_trackers(log_with: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the trackers to give Accelerate, the requested ones whose package is missing), in the order asked.

    ``"all"`` stands for every built-in tracker whose package is installed; when none is, it is "missing".
    """
    available: list[str] = []
    missing: list[str] = []
    for requested in log_with:
        names = [requested] if requested != "all" else [n for n in BUILTIN_TRACKERS if tracker_available(n)] or ["all"]
        for name in names:
            if name not in available and name not in missing:
                (available if name != "all" and tracker_available(name) else missing).append(name)
    return available, missing


def missing_tracker_warning(name: str) -> str:
    """The one line printed for a requested tracker whose package is not installed."""
    if name == "all":
        return ("gan_accel: warning: log_with 'all' found no tracker package installed: pip install "
                "'gan_accel[tensorboard]' (or another tracker's extra); training continues without trackers")
    return (f"gan_accel: warning: tracker {name!r} needs its package: pip install 'gan_accel[{name}]'; "
            "training continues without it")


def tracker_name(tracker: Any) -> str:
    """The name of an entry of ``accelerator.log_with`` or ``accelerator.trackers`` (enum, string or tracker)."""
    value = getattr(tracker, "value", None)  # accelerate.utils.LoggerType
    if isinstance(value, str):
        return value
    name = getattr(tracker, "name", None)
    return name if isinstance(name, str) else str(tracker)


def tracker_choices() -> tuple[str, ...]:
    """The names ``log_with`` accepts: Accelerate's trackers (``LoggerType``, "all" included) and any tracker class
    registered with ``accelerate.tracking.register_tracker_class`` before the config is built."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS
    from accelerate.utils import LoggerType

    names = {str(getattr(t, "value", t)) for t in LoggerType}
    return tuple(sorted(names | set(LOGGER_TYPE_TO_CLASS), key=lambda n: (n != "all", n)))
