"""One validated dataclass describing a training run.

Every field is checked when the config is built, so a typo or a bad value fails before any model,
data or Accelerator is touched, with a message that names the field and what it accepts.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .augment import AUGMENTS
from .errors import ConfigError
from .objectives.losses import LOSSES, GANLoss
from .tracking import tracker_choices

MIXED_PRECISION_CHOICES = ("no", "bf16", "fp16")
MAX_SEED = 2**31 - 1  # numpy's seed must be < 2**32, and Accelerate's set_seed adds the process index
# Micro-batches one step draws per process (grad_accum_steps * n_critic): a stop (a signal, --max-time) is acted on
# between steps, so a step far longer than any real one would make a run that nothing but SIGKILL ends.
MAX_BATCHES_PER_STEP = 4096
LR_SCHEDULE_CHOICES = ("linear", "constant")
LABEL_DISTRIBUTIONS = ("uniform", "data")
RAMP_SHAPES = ("cosine", "linear")
ADA_SIGNALS = ("rt", "heldout")  # what steers ADA's p: its r_t, or D's held-out overfitting (OverfitSteering)
RAMPED_FIELDS = ("lr_G", "lr_D", "r1_gamma", "r2_gamma", "ema_half_life", "augment_p")  # and each of the betas


@dataclass(frozen=True)
class Ramp:
    """A setting that moves from ``start`` to ``end`` over the first ``images`` training images, then stays.

    Its value after ``n`` images (:attr:`TrainConfig` counts them over all processes and micro-batches) is
    ``start + (end - start) * f(min(n / images, 1))``, ``f(t) = (1 - cos(pi t)) / 2`` (``"cosine"``) or ``t``
    (``"linear"``). ``config.json`` stores it as ``{"start": ..., "end": ..., "images": ..., "shape": ...}``.
    """

    start: float
    end: float
    images: float
    shape: str = "cosine"

    def __post_init__(self) -> None:
        for name in ("start", "end", "images"):
            if not _is_number(getattr(self, name)):
                raise ConfigError(f"Ramp {name}={getattr(self, name)!r} is invalid: expected a finite number")
        if self.images <= 0:
            raise ConfigError(f"Ramp images={self.images!r} is invalid: expected the number of training images "
                              "over which the value moves, > 0")
        if self.shape not in RAMP_SHAPES:
            raise ConfigError(f"Ramp shape={self.shape!r} is invalid: choose {' or '.join(RAMP_SHAPES)}")

    def __call__(self, images: float) -> float:
        """The value after ``images`` training images."""
        if images >= self.images:
            return self.end  # exactly end, not start + (end - start) * 1.0
        t = images / self.images
        f = (1.0 - math.cos(math.pi * t)) / 2.0 if self.shape == "cosine" else t
        return self.start + (self.end - self.start) * f

    def __format__(self, spec: str) -> str:  # f"{gamma:g}" in phase names and messages
        return f"Ramp({self.start:{spec}} -> {self.end:{spec}} over {self.images:g} images, {self.shape})"


@dataclass
class TrainConfig:
    """Everything that defines a GAN run.

    Step counting: one *step* is one pass over the phase list (see :mod:`gan_accel.engine.phases`).
    With the default list (D ``n_critic`` times, then G) a step is one generator optimizer step; it
    consumes ``n_critic * grad_accum_steps`` batches of ``batch_size`` images per process and makes
    ``n_critic`` discriminator optimizer steps. Sample, log and checkpoint intervals count steps;
    each network's learning-rate schedule counts that network's scheduler-ticking optimizer steps.
    """

    max_steps: int = 2000
    batch_size: int = 128  # per process, per micro-batch
    grad_accum_steps: int = 1
    n_critic: int = 1  # discriminator updates per generator update
    loss: Union[str, GANLoss] = "nonsaturating"
    z_dim: int = 100
    lr_G: float | Ramp = 2e-4
    lr_D: float | Ramp = 2e-4
    betas_G: tuple[float | Ramp, float | Ramp] = (0.5, 0.999)  # e.g. (0.5, Ramp(0.99, 0.999, 5e6)): R3GAN's beta2
    betas_D: tuple[float | Ramp, float | Ramp] = (0.5, 0.999)
    lr_schedule: str = "linear"  # linear warmup then linear decay to 0, or warmup then constant
    warmup_ratio: float = 0.1  # share of each network's optimizer steps spent warming up
    ema_decay: float | None = None  # e.g. 0.999: sample and export an EMA of G's weights (decay per G step)
    ema_half_life: float | Ramp | None = None  # or: the EMA's half-life in training images (StyleGAN2), e.g. 10_000
    ema_rampup: float | None = None  # with ema_half_life: cap it at rampup x images seen (StyleGAN2: 0.05)
    ema_batchnorm: str = "copy"  # the EMA's BatchNorm statistics: "copy" G's, or "recompute" them for its weights
    clip_grad_norm_G: float | None = None
    clip_grad_norm_D: float | None = None
    r1_gamma: float | Ramp | None = None  # R1 penalty gamma/2 * E|grad_x D(x)|^2 on real data, as a lazy phase
    r2_gamma: float | Ramp | None = None  # R2 penalty gamma/2 * E|grad D(G(z))|^2 on G's samples, with R1 (r1_every)
    r1_every: int = 16  # R1 runs every N-th D step, with its loss multiplied by N (StyleGAN2's lazy R1)
    gp_weight: float | None = None  # WGAN-GP: weight * E(|grad D(x_hat)| - 1)^2, added to every D step
    num_classes: int | None = None  # a class-conditional run: D(x, y), G(z, y); the data must carry labels
    label_distribution: str = "uniform"  # G's labels: "uniform" over classes, or "data" (the real batch's labels)
    class_loss_weight: float = 0.0  # > 0: auxiliary class loss on D(x, y, all_classes=True) (conditional runs)
    mixed_precision: str = "no"  # "bf16": autocast in bfloat16 (also on CPU); "fp16": CUDA only
    channels_last: bool = False  # convolution weights (hence activations) in channels-last memory format
    compile: bool = False  # torch.compile G and D; phases with a double backward (R1, GP) run eagerly
    keep_freed_memory: bool = False  # Linux/glibc: freed memory stays in the process (no page faults per step)
    augment: str = "none"  # differentiable augmentation of every image D sees: "none", "diffaugment" or "ada"
    augment_p: float | Ramp | None = None  # diffaugment: each transform's probability (default 1); ada: the first p (0)
    ada_target: float = 0.6  # ada: the E[sign(D(real))] (rpgan: of D(real) - D(fake)) that p steers towards (higher: D overfits, p rises)
    ada_signal: str = "rt"  # ada: what steers p: "rt" (ADA's sign of D(real)) or "heldout" (D's held-out gap, see OverfitSteering)
    ada_interval: int = 4  # ada: steps between updates of p
    ada_kimg: float = 100.0  # ada: thousands of real images over which p can move from 0 to 1
    sample_every: int = 500
    num_samples: int = 64
    keep_samples: int | None = None  # the newest K step-stamped sample grids are kept (plus progress.gif's); None: all
    gif_frames: int = 100  # at most this many frames in progress.gif, evenly spaced over the run
    log_every: int = 50
    output_dir: str = "runs/gan"
    checkpoint_every: int = 1000  # steps between checkpoints (one is always written at the end)
    keep_checkpoints: int = 2  # the newest K complete checkpoints are kept
    nan_guard: bool = True  # skip non-finite updates on the device; counters read at log rows and checkpoints
    max_bad_updates: int = 10  # stop after this many consecutive skipped updates of one network
    collective_timeout: float = 120.0  # torch's collective timeout: the longest one process waits for another
    max_time: float | None = None  # seconds of this fit(): then a checkpoint, the final generator, and a clean stop
    seed: int = 0
    progress_bar: bool = True
    log_with: tuple[str, ...] = ()  # experiment trackers through Accelerate: "tensorboard", "mlflow", "wandb", ..., "all"
    tracker_project: str | None = None  # the trackers' project (experiment) name; None: the output folder's name
    model: dict[str, Any] | None = None  # the reference networks' spec (gan_accel.models), saved with the run
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes saved with the run

    def __post_init__(self) -> None:
        self.betas_G = tuple(_read_ramp(b) for b in self.betas_G)  # JSON round-trips give lists, and Ramps as dicts
        self.betas_D = tuple(_read_ramp(b) for b in self.betas_D)
        for name in RAMPED_FIELDS:
            setattr(self, name, _read_ramp(getattr(self, name)))
        if isinstance(self.log_with, str):  # "tensorboard" or "tensorboard,mlflow"
            self.log_with = tuple(name.strip() for name in self.log_with.split(",") if name.strip())
        elif isinstance(self.log_with, list):  # JSON round-trips give lists
            self.log_with = tuple(self.log_with)
        self.validate()

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid field."""
        for name in ("max_steps", "batch_size", "sample_every", "num_samples", "log_every", "z_dim",
                     "checkpoint_every", "keep_checkpoints", "max_bad_updates", "r1_every", "grad_accum_steps",
                     "n_critic"):
            _require_int(name, getattr(self, name), minimum=1)
        if self.keep_samples is not None:
            _require_int("keep_samples", self.keep_samples, minimum=1, hint="or None to keep every sample grid")
        _require_int("gif_frames", self.gif_frames, minimum=1)
        if self.grad_accum_steps * self.n_critic > MAX_BATCHES_PER_STEP:
            raise ConfigError(f"grad_accum_steps={self.grad_accum_steps} with n_critic={self.n_critic} draws "
                              f"{self.grad_accum_steps * self.n_critic:,} micro-batches per step, more than the "
                              f"{MAX_BATCHES_PER_STEP:,} allowed (a stop is acted on between steps): raise batch_size "
                              "instead, or accumulate less")
        _require_int("seed", self.seed, minimum=0)
        if self.seed > MAX_SEED:
            raise ConfigError(f"seed={self.seed!r} is invalid: expected an integer from 0 to {MAX_SEED} (2**31 - 1: "
                              "numpy takes seeds below 2**32, and each process seeds with seed + its index)")
        for name in ("lr_G", "lr_D"):
            for label, value in _endpoints(name, getattr(self, name)):
                _require_positive_float(label, value)
        _require_positive_float("collective_timeout", self.collective_timeout, hint="seconds")
        if self.max_time is not None:
            _require_positive_float("max_time", self.max_time, hint="seconds, or None for no limit")
        for name in ("betas_G", "betas_D"):
            betas = getattr(self, name)
            values = [v for beta in betas for _, v in _endpoints(name, beta)]
            if len(betas) != 2 or not all(_is_number(v) and 0.0 <= v < 1.0 for v in values):
                raise ConfigError(f"{name}={betas!r} is invalid: expected two numbers in [0, 1) (or Ramps between "
                                  "such numbers), e.g. (0.5, 0.999)")
        for name in ("clip_grad_norm_G", "clip_grad_norm_D", "r1_gamma", "r2_gamma", "gp_weight"):
            if getattr(self, name) is not None:
                what = "clipping" if name.startswith("clip") else "the penalty"
                for label, value in _endpoints(name, getattr(self, name)):
                    _require_positive_float(label, value, hint=f"or None to disable {what}")
        if self.ema_decay is not None and not (_is_number(self.ema_decay) and 0.0 < self.ema_decay < 1.0):
            raise ConfigError(f"ema_decay={self.ema_decay!r} is invalid: expected a number in (0, 1), or None for no EMA")
        if self.ema_half_life is not None:
            if self.ema_decay is not None:
                raise ConfigError("ema_decay and ema_half_life are both set: keep one (ema_half_life counts images, "
                                  "ema_decay counts G steps)")
            for label, value in _endpoints("ema_half_life", self.ema_half_life):
                _require_positive_float(label, value, hint="training images, or None")
        if self.ema_rampup is not None:
            _require_positive_float("ema_rampup", self.ema_rampup, hint="e.g. 0.05, or None")
            if self.ema_half_life is None:
                raise ConfigError("ema_rampup needs ema_half_life: the ramp caps the half-life at rampup x images seen")
        if self.ema_batchnorm not in ("copy", "recompute"):
            raise ConfigError(f"ema_batchnorm={self.ema_batchnorm!r} is invalid: choose 'copy' (G's statistics) or "
                              "'recompute' (measured for the EMA's weights)")
        if not (_is_number(self.warmup_ratio) and 0.0 <= self.warmup_ratio < 1.0):
            raise ConfigError(f"warmup_ratio={self.warmup_ratio!r} is invalid: expected a number in [0, 1)")
        for name, choices in (("mixed_precision", MIXED_PRECISION_CHOICES), ("lr_schedule", LR_SCHEDULE_CHOICES)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid: choose one of {', '.join(choices)}")
        for name in ("channels_last", "compile", "keep_freed_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid: expected True or False")
        self._validate_choices()

    def _validate_choices(self) -> None:
        """The named choices (augmentation, loss, labels, trackers) and the saved fields."""
        if self.augment not in AUGMENTS:
            raise ConfigError(f"augment={self.augment!r} is invalid: choose one of {', '.join(AUGMENTS)}")
        for label, p in _endpoints("augment_p", self.augment_p) if self.augment_p is not None else ():
            if not (_is_number(p) and 0.0 <= p and (p <= 1.0 if self.augment == "diffaugment" else p < 1.0)):
                raise ConfigError(f"{label}={p!r} is invalid: expected a probability in [0, 1] (ada: below 1), "
                                  "or None for the default")
        if isinstance(self.augment_p, Ramp) and self.augment == "ada":
            raise ConfigError("augment_p is a Ramp but augment='ada' steers p itself: give ada a number (its first "
                              "p), or ramp p with augment='diffaugment'")
        if self.augment_p is not None and self.augment == "none":
            raise ConfigError("augment_p is set but augment='none': choose augment='diffaugment' or 'ada'")
        if not (_is_number(self.ada_target) and -1.0 < self.ada_target < 1.0):
            raise ConfigError(f"ada_target={self.ada_target!r} is invalid: expected a number in (-1, 1), e.g. 0.6")
        if self.ada_signal not in ADA_SIGNALS:
            raise ConfigError(f"ada_signal={self.ada_signal!r} is invalid: choose one of {', '.join(ADA_SIGNALS)}")
        if self.ada_signal != "rt" and self.augment != "ada":
            raise ConfigError(f"ada_signal={self.ada_signal!r} steers ADA's p, but augment={self.augment!r}: add "
                              "augment='ada' (--augment ada), or leave ada_signal out")
        _require_int("ada_interval", self.ada_interval, minimum=1)
        _require_positive_float("ada_kimg", self.ada_kimg, hint="thousands of images, e.g. 100")
        if isinstance(self.loss, str):
            if self.loss not in LOSSES:
                raise ConfigError(f"loss={self.loss!r} is unknown: choose one of {', '.join(sorted(LOSSES))}, "
                                  "or pass a GANLoss")
        elif not isinstance(self.loss, GANLoss):
            raise ConfigError(f"loss={self.loss!r} is invalid: pass a name ({', '.join(sorted(LOSSES))}) "
                              "or a gan_accel.GANLoss")
        if self.num_classes is not None:
            _require_int("num_classes", self.num_classes, minimum=2, hint="or None for an unconditional run")
        if not (_is_number(self.class_loss_weight) and self.class_loss_weight >= 0):
            raise ConfigError(f"class_loss_weight={self.class_loss_weight!r} is invalid: expected a number >= 0 "
                              "(0 turns the class loss off)")
        if self.class_loss_weight and self.num_classes is None:
            raise ConfigError(f"class_loss_weight={self.class_loss_weight!r} needs a conditional run: set num_classes "
                              "as well, or class_loss_weight=0")
        if self.label_distribution not in LABEL_DISTRIBUTIONS:
            raise ConfigError(f"label_distribution={self.label_distribution!r} is invalid: choose "
                              f"{' or '.join(LABEL_DISTRIBUTIONS)}")
        if not isinstance(self.output_dir, (str, Path)) or str(self.output_dir) == "":
            raise ConfigError(f"output_dir={self.output_dir!r} is invalid: expected a folder path")
        choices = tracker_choices()
        if not isinstance(self.log_with, (tuple, list)) or not all(isinstance(n, str) for n in self.log_with):
            raise ConfigError(f"log_with={self.log_with!r} is invalid: expected tracker names, e.g. ('tensorboard',), "
                              f"from {', '.join(choices)}")
        unknown = [name for name in self.log_with if name not in choices]
        if unknown:
            raise ConfigError(f"log_with={tuple(self.log_with)!r} is invalid: {unknown[0]!r} is not a tracker Accelerate "
                              f"knows; choose from {', '.join(choices)}")
        if self.tracker_project is not None and not (isinstance(self.tracker_project, str) and self.tracker_project.strip()):
            raise ConfigError(f"tracker_project={self.tracker_project!r} is invalid: expected a non-empty name, or None "
                              "for the output folder's name")
        if self.model is not None and not (isinstance(self.model, dict) and _json_like(self.model)):
            raise ConfigError(f"model={self.model!r} is invalid: expected a dict of JSON values (the networks' "
                              "spec, e.g. {'family': 'dcgan', 'width': 64, ...}), or None")

    # -- derived quantities -------------------------------------------------------------------
    @property
    def loss_fn(self) -> GANLoss:
        """The loss pair this run trains with."""
        return LOSSES[self.loss] if isinstance(self.loss, str) else self.loss

    @property
    def tracker_project_name(self) -> str:
        """The project (experiment) name the trackers log under: ``tracker_project``, else the output folder's name."""
        if self.tracker_project:
            return self.tracker_project
        return Path(self.output_dir).name or Path(self.output_dir).resolve().name or "gan_accel"

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; a custom loss is recorded by its name."""
        out = dataclasses.asdict(self)
        out["loss"] = self.loss_fn.name
        out["output_dir"] = str(self.output_dir)
        return out

    def to_json(self, path: str | Path) -> None:
        """Write the resolved config next to the run's outputs."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build a config from :meth:`to_dict` output; unknown keys are an error, not ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}: known fields are {sorted(known)}")
        return cls(**data)


def _read_ramp(value: Any) -> Any:
    """A Ramp from its config.json form (a dict of exactly its fields); any other value as it is."""
    if isinstance(value, dict) and set(value) == {"start", "end", "images", "shape"}:
        return Ramp(**value)
    return value


def _endpoints(name: str, value: Any) -> list[tuple[str, Any]]:
    """What a check of a field looks at: the value, or for a field that may ramp a Ramp's start and end (named)."""
    if isinstance(value, Ramp) and (name in RAMPED_FIELDS or name.startswith("betas_")):
        return [(f"{name}.start", value.start), (f"{name}.end", value.end)]
    return [(name, value)]


def _json_like(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_like(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_json_like(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require_int(name: str, value: Any, minimum: int, hint: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name}={value!r} is invalid: expected an integer >= {minimum}" + (f", {hint}" if hint else ""))


def _require_positive_float(name: str, value: Any, hint: str = "") -> None:
    if not _is_number(value) or value <= 0:
        extra = f" ({hint})" if hint else ""
        raise ConfigError(f"{name}={value!r} is invalid: expected a finite number > 0{extra}")


# Fields a resumed run cannot change: they shape the networks' inputs, the batch, the losses, the phase
# list or what the checkpoint holds. Everything else (rates, betas, schedule, max_steps, intervals,
# clipping, penalty weights, ...) may change on resume and is applied from that step on.
FIXED_ON_RESUME = ("batch_size", "grad_accum_steps", "n_critic", "loss", "z_dim", "seed", "mixed_precision",
                   "ema_decay", "num_samples", "r1_every", "num_classes", "label_distribution", "model", "augment",
                   "ada_signal")
NOT_COMPARED = ("output_dir",)  # where the run is, not what it trains
_PRESENCE = ("r1_gamma", "r2_gamma", "gp_weight", "ema_half_life")  # on or off is fixed (it adds or removes a phase); the weight may change


def compare_configs(saved: dict[str, Any], requested: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """(refused differences as ``"field: old -> new"``, allowed changes as ``{field: [old, new]}``).

    Both are :meth:`TrainConfig.to_dict` dicts: the checkpoint's and the resumed run's.
    """
    refused, changed = [], {}

    def differ(name: str, old: Any, new: Any) -> None:
        if name in FIXED_ON_RESUME or (name in _PRESENCE and (old is None) != (new is None)):
            refused.append(f"{name}: {old!r} -> {new!r}")
        else:
            changed[name] = [old, new]

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for name in sorted(set(saved) | set(requested)):
        if name in NOT_COMPARED:
            continue
        if name not in saved and _comparable(requested.get(name)) == _comparable(defaults.get(name)):
            continue  # a field added after the checkpoint was written, left at its default: no change
        old, new = _comparable(saved.get(name)), _comparable(requested.get(name))
        if name == "extra" and isinstance(old, dict) and isinstance(new, dict):
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    differ(f"extra.{key}", old.get(key), new.get(key))
        elif old != new:
            differ(name, old, new)
    return refused, changed


def _comparable(value: Any) -> Any:
    """JSON's view of a value: tuples and lists compare equal (a config read back from JSON has lists)."""
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value
