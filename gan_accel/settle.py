"""One place settles a run: what the user gave, what the data is and where it runs become the
:class:`~gan_accel.TrainConfig`, the networks' spec and the lines to print, each setting with where it came from.

``gan-accel train``, the example scripts and your own code call :func:`settle`. A setting is named as its flag
is, with ``_`` for ``-`` (``lr_g``, ``batch_size``, ``steps``), and its value is the first of: the user's (source
``flag``), the resumed run's record (``resume``), the caller's own default (``default``: a script's), the recipe's
row for this data and device (``recipe``, :mod:`gan_accel.recipes`), and :data:`DEFAULTS` (``default``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import TrainConfig
from .errors import ConfigError
from .models import default_spec
from .recipes import Recipe, default_recipe, family_for

# Where the command line's default differs from TrainConfig's; docs/config.md says why in one sentence.
COMMAND_DEFAULTS: dict[str, Any] = {"batch_size": 64, "lr_schedule": "constant", "warmup_ratio": 0.05,
                                    "ema_decay": 0.99, "channels_last": True, "label_distribution": "data",
                                    "class_weight": 1.0}
NETWORK_SETTINGS = ("model", "width", "z_dim", "spectral_norm", "d_position")  # the spec's, not the config's
CONDITIONAL_SETTINGS = ("label_distribution", "class_weight")
NOT_RESUMED = ("output_dir", "max_time", "no_progress")  # the invocation's own: a resume names them again
LENGTHS = ("steps", "epochs", "images")  # one of them gives the run's length
MARKS = {"flag": "a flag given", "resume": "the resumed run's own", "default": "this script's own default"}


@dataclass(frozen=True)
class DataFacts:
    """What the data is: the side of its square images in pixels, how many there are, their channels, the number of
    classes of a class-conditional run (None: unconditional), and how many a pass over the data trains on when some
    are held out (None: all of them)."""

    side: int
    count: int
    channels: int = 3
    classes: int | None = None
    trained: int | None = None


@dataclass
class SettledRun:
    """A settled run: its config, its networks' spec (``gan_accel.models.build_models(spec)``), every setting's value
    and source (``flag``, ``resume``, ``default`` or ``recipe``), the lines to print before it starts, and the
    recipe's row (None when the caller asked for none)."""

    config: TrainConfig
    spec: dict[str, Any]
    settings: dict[str, Any]
    sources: dict[str, str]
    notes: list[str] = field(default_factory=list)
    recipe: Recipe | None = None


# The settings that are one TrainConfig field each, by that field's name (most are named alike).
FIELDS = {name: name for name in (
    "batch_size", "n_critic", "loss", "lr_schedule", "warmup_ratio", "ema_decay", "ema_half_life", "ema_rampup",
    "ema_batchnorm", "r1_gamma", "r2_gamma", "r1_every", "mixed_precision", "channels_last", "keep_freed_memory",
    "sample_every", "log_every", "output_dir", "seed", "log_with", "tracker_project", "checkpoint_every",
    "keep_checkpoints", "keep_samples", "gif_frames", "max_bad_updates", "collective_timeout", "max_time", "augment",
    "augment_p", "ada_target", "ada_signal", "num_samples", "label_distribution")}
FIELDS.update(steps="max_steps", grad_accum="grad_accum_steps", lr_g="lr_G", lr_d="lr_D",
              class_weight="class_loss_weight")


def settings_of(config: TrainConfig, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every setting as ``config`` and the networks' ``spec`` have it (the inverse of :func:`config_fields`)."""
    spec = spec or {}
    return {**{name: getattr(config, field) for name, field in FIELDS.items()},
            "beta1": config.betas_G[0], "beta2": config.betas_G[1], "log_with": list(config.log_with),
            "no_progress": not config.progress_bar, "model": spec.get("family"), "width": spec.get("width"),
            "z_dim": spec.get("z_dim"), "spectral_norm": bool(spec.get("spectral_norm", False)),
            "d_position": spec.get("d_position")}


# Every setting's default: TrainConfig's own, the command line's where they differ, and None for the networks'
# (the family's own, or the recipe's); read by the flags (gan_accel.cli.train_flags) and by settle.
DEFAULTS: dict[str, Any] = {**settings_of(TrainConfig()), **COMMAND_DEFAULTS}


def config_fields(values: Mapping[str, Any], spec: dict[str, Any], classes: int | None) -> dict[str, Any]:
    """The TrainConfig fields of the settled ``values`` and the networks' ``spec``."""
    v = values
    fields = {field: v[name] for name, field in FIELDS.items()}
    fields.update(
        z_dim=spec["z_dim"], model=spec, betas_G=(v["beta1"], v["beta2"]), betas_D=(v["beta1"], v["beta2"]),
        ema_decay=None if v["ema_half_life"] else v["ema_decay"] or None, r1_gamma=v["r1_gamma"] or None,
        r2_gamma=v["r2_gamma"] or None, progress_bar=not v["no_progress"],
        log_with=tuple(name.strip() for names in v["log_with"] for name in names.split(",") if name.strip()))
    if classes:
        fields["num_classes"] = classes
    else:  # TrainConfig's own: an unconditional run has no labels to draw and no class loss
        del fields["label_distribution"], fields["class_loss_weight"]
    return fields


def steps_for(values: Mapping[str, Any], batches_per_epoch: int, processes: int = 1) -> int:
    """The run's length in steps: ``epochs`` (``batches_per_epoch`` per process), else ``images`` (real images over
    all processes), else ``steps``."""
    per_step = values["grad_accum"] * values["n_critic"]  # batches a step draws on each process
    if values.get("epochs") is not None:
        return max(1, int(values["epochs"] * batches_per_epoch) // per_step)
    if values.get("images") is not None:
        return max(1, math.ceil(values["images"] / (per_step * values["batch_size"] * processes)))
    return values["steps"]


def spec_overrides(values: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The networks' settings in ``values`` that fit ``family`` (as spec keys); one line for one that does not."""
    overrides = {key: values[key] for key in ("width", "z_dim") if values.get(key) is not None}
    if family == "dcgan":
        if values.get("spectral_norm"):
            overrides["spectral_norm"] = True
        if values.get("d_position") is not None:
            overrides["d_position"] = values["d_position"]
    elif values.get("spectral_norm"):
        raise ConfigError(f"--spectral-norm sets the dcgan family's D ({family}'s is fixed): leave the flag out")
    elif values.get("d_position") is not None:
        raise ConfigError(f"--d-position sets the dcgan family's D: leave it out with --model {family}")
    return overrides


def setting(name: str, given: Mapping[str, Any], recorded: TrainConfig | None = None,
            defaults: Mapping[str, Any] | None = None) -> Any:
    """A setting no recipe fills (``batch_size``, ``seed``), as :func:`settle` chooses it, for work that comes before
    the data is known (which images to hold out)."""
    layers = _layers(given, recorded, defaults)
    return next(layer[name] for _, layer in layers if name in layer)


def settle(given: Mapping[str, Any], data: DataFacts, *, gpu: bool = False, processes: int = 1,
           recorded: TrainConfig | Mapping[str, Any] | None = None, defaults: Mapping[str, Any] | None = None,
           recipe: bool = True) -> SettledRun:
    """Settle a run: ``given`` holds only the settings the user chose (by their flags' names: ``lr_g``, ``steps``,
    ``model``, ...), ``data`` the facts of the data, ``gpu`` and ``processes`` where it runs. ``recorded`` is the
    resumed run's config (``config.json``; its ``model`` is the spec), whose settings win over everything but
    ``given``; ``defaults`` are the caller's own, which win over the recipe's row (``recipe=False``: no row)."""
    check_given(given, bool(data.classes))
    if isinstance(recorded, Mapping):
        recorded = TrainConfig.from_dict(dict(recorded))
    row = default_recipe(data.side, data.count, gpu, data.classes) if recipe else None
    values, sources, chosen = _choose(_layers(given, recorded, defaults), row, data, gpu)
    trained = data.count if data.trained is None else data.trained
    values["steps"] = steps_for(values, trained // values["batch_size"] // processes, processes)
    family, conditional = values["model"], bool(data.classes)
    spec = default_spec(family, data.side, data.channels, data.classes or None, **spec_overrides(values, family))
    notes = _recipe_note(row, family, values, sources, chosen, conditional) if row else []
    for name in ("width", "z_dim", "d_position"):  # left out by all: the family's own
        values[name] = spec.get(name)
    if conditional and "num_samples" not in chosen:  # a row of samples per class in the grids
        values["num_samples"] = data.classes * max(1, min(8, 256 // data.classes))
    config = TrainConfig(**config_fields(values, spec, data.classes))
    if row is not None:
        _ramp(config, row, config.max_steps * config.batch_size * config.grad_accum_steps * processes, chosen)
    if not conditional:
        values.update(dict.fromkeys(CONDITIONAL_SETTINGS))
    return SettledRun(config, spec, values, sources, notes, row)


def check_given(given: Mapping[str, Any], conditional: bool) -> None:
    """One line for a setting ``given`` that settle does not know, that fits only a conditional run, or for more than
    one length."""
    unknown = sorted(set(given) - set(DEFAULTS) - {"epochs", "images"})
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}: a setting is named as its flag, with _ for - "
                          f"(known: {', '.join(sorted(DEFAULTS))}, epochs, images)")
    if sum(given.get(name) is not None for name in LENGTHS) > 1:
        raise ConfigError("steps, epochs and images each give the run's length: give one of them")
    if conditional and given.get("d_position") == "profiles":  # checked before the data is read
        raise ConfigError("--d-position profiles is a read of an unconditional D: with --conditional choose coords, "
                          "moments or none")
    for name in () if conditional else CONDITIONAL_SETTINGS:
        if given.get(name) is not None:
            raise ConfigError(f"--{name.replace('_', '-')} is a setting of a class-conditional run: add "
                              "--conditional (labels from class subfolders or a class column), or leave it out")


def _layers(given: Mapping[str, Any], recorded: TrainConfig | None,
            defaults: Mapping[str, Any] | None) -> list[tuple[str, Mapping[str, Any]]]:
    """Where a setting's value may come from before the recipe, first first, and the table after it."""
    resumed: dict[str, Any] = {}
    if recorded is not None:
        resumed = {k: v for k, v in settings_of(recorded, recorded.model).items() if k not in NOT_RESUMED and
                   (recorded.model is not None or k not in NETWORK_SETTINGS)}
    return [("flag", given), ("resume", resumed), ("default", defaults or {}), ("default", DEFAULTS)]


def _choose(layers: list[tuple[str, Mapping[str, Any]]], row: Recipe | None, data: DataFacts,
            gpu: bool) -> tuple[dict[str, Any], dict[str, str], set[str]]:
    """Each setting's value and source, and the names chosen before the recipe (given, resumed, the caller's)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    chosen: set[str] = set()

    def pick(name: str, filled: Mapping[str, Any]) -> None:
        for index, (source, layer) in enumerate(layers):
            if index == len(layers) - 1 and name in filled:
                values[name], sources[name] = filled[name], "recipe" if row else "default"
                return
            if name in layer:
                values[name], sources[name] = layer[name], source
                chosen.update((name,) if index < len(layers) - 1 else ())
                return
        values[name], sources[name] = None, "default"  # epochs, images: not given

    pick("model", {"model": row.model if row else family_for(data.side, gpu)})
    filled = _recipe_row(row, values["model"], bool(data.classes)) if row else {}
    pick("loss", filled)
    if row and values["loss"] == "rpgan":  # R2 is the relativistic loss's partner
        filled["r2_gamma"] = 0.0 if data.classes else row.r2_gamma
    for name in (*DEFAULTS, "epochs", "images"):
        if name not in ("model", "loss"):
            pick(name, filled)
    if values["epochs"] is not None or values["images"] is not None:
        sources["steps"] = "flag"
    return values, sources, chosen


def _recipe_row(row: Recipe, family: str, conditional: bool) -> dict[str, Any]:
    """What the recipe's row fills, by setting, for ``family`` (its width only for its own family)."""
    filled = {name: value for name, value in row.settings().items() if name not in ("model", "width", "r2_gamma")}
    filled["steps"] = row.steps
    if conditional:  # a conditional run's auxiliary class loss already regularises D (measured)
        filled["r1_gamma"] = 0.0
    if family == row.model and row.width:
        filled["width"] = row.width
    return filled


def _ramp(config: TrainConfig, row: Recipe, images: int, kept: set[str]) -> None:
    """The recipe's ramps over the run's ``images``, on the settings the row filled (``kept``: those it did not)."""
    for name, ramp in row.ramps(images, kept).items():
        if name == "beta2":
            config.betas_G = (config.betas_G[0], ramp)
            config.betas_D = (config.betas_D[0], ramp)
        elif name == "augment_p":
            if config.augment == "diffaugment":
                config.augment_p = ramp
        elif getattr(config, name):  # a penalty the run leaves off stays off
            setattr(config, name, ramp)
    config.validate()


def _recipe_note(row: Recipe, family: str, values: Mapping[str, Any], sources: Mapping[str, str],
                 chosen: set[str], conditional: bool) -> list[str]:
    """The run's recipe line: what the run uses of the row's settings, those chosen instead marked by their source
    (no line when the row filled nothing but the length)."""
    names = [name for name in row.settings() if name != "model"]
    if not any(sources[name] == "recipe" for name in names):
        return []
    marks = {name: sources[name] for name in (*names, "model") if name in chosen}
    unpenalised = " (conditional: the class loss regularises D, not R1/R2)" if conditional else ""
    legend = ", ".join(f"({kind}): {MARKS[kind]}" for kind in dict.fromkeys(marks.values()))
    loss = getattr(values["loss"], "name", values["loss"])  # a GANLoss of the caller's: its name
    line = row.describe({**{name: values[name] for name in names}, "model": family, "loss": loss}, marks)
    return [f"gan_accel: the recipe for {family} at this size and data: {line}{unpenalised}"
            + (f"; {legend}, used instead of the recipe's" if marks else "")]
