"""Training health: one warning line per episode when a run fails in a recognisable way (D wins outright, D
is dead, D overfits its training images, G's loss explodes, the samples' diversity collapses), and
``health/diversity`` and D's probe (``health/d_spread``, ``health/overfit``, ...: callbacks/d_probe.py) in
the metrics.

The rules and their defaults are in docs/health-and-trackers.md. A rule warns when its condition starts to
hold and is silent until one healthy row or measurement ends the episode. The state is checkpointed, so a
resumed run warns exactly where the uninterrupted one would.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..errors import ConfigError
from ..storage.layout import HEALTH, write_json
from .base import Callback
from .d_probe import probe_logits, probe_statistics

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

DIVERSITY = "health/diversity"
PROBE_REALS = 32  # training reals in D's probe: the first batch's first ones (kept in the checkpoint)
PREFIX = "gan_accel: warning:"


def mean_pairwise_distance(samples: torch.Tensor, limit: int | None = None) -> float:
    """Mean Euclidean distance between the (flattened) samples of a batch, over all pairs (NaN under 2)."""
    flat = samples.detach().float().reshape(samples.shape[0], -1)[:limit]
    return float(torch.pdist(flat).mean()) if len(flat) > 1 else math.nan


def sample_diversity(samples: torch.Tensor, labels: torch.Tensor | None, limit: int | None = None) -> float:
    """:func:`mean_pairwise_distance`, or with ``labels`` its mean over the classes with two samples or more: a
    conditional G that ignores its latents draws one image per class, which the classes' differences would hide."""
    if labels is not None:
        labels = labels.detach().cpu()[:limit]
        within = [mean_pairwise_distance(samples[:limit][labels == c]) for c in labels.unique().tolist()
                  if int((labels == c).sum()) > 1]
        if within:
            return sum(within) / len(within)
    return mean_pairwise_distance(samples, limit)


class HealthMonitor(Callback):
    """Warns once per episode when D wins outright, D is dead, D overfits its training images, G's loss
    explodes or the samples' diversity collapses; logs ``health/diversity`` and D's probe (``health/d_spread``,
    ``health/d_real``, ``health/d_fake``, ``health/rt``, with held-out reals ``health/d_heldout`` and
    ``health/overfit``). The rules: docs/health-and-trackers.md.

    ``held_out``: real images never trained on, shaped like the training samples, for D's overfitting check
    (``(images, labels)`` in a conditional run); up to ``max_samples`` of them are used. Without them the
    overfitting rule is off. ``gan-accel train`` holds out a slice of the user's images itself.
    """

    def __init__(self, *, patience: int = 3, d_loss_fraction: float = 0.05, g_loss_factor: float = 3.0,
                 early_rows: int = 5, diversity_drop: float = 0.5, diversity_floor: float = 0.1,
                 early_samples: int = 3, max_samples: int = 64, d_spread_floor: float = 0.05,
                 overfit_limit: float = 0.5, held_out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
                 ) -> None:
        for name, value, least in (("patience", patience, 1), ("early_rows", early_rows, 1),
                                   ("early_samples", early_samples, 1), ("max_samples", max_samples, 2)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
            setattr(self, name, value)
        for name, value in (("d_loss_fraction", d_loss_fraction), ("g_loss_factor", g_loss_factor),
                            ("diversity_drop", diversity_drop), ("diversity_floor", diversity_floor),
                            ("d_spread_floor", d_spread_floor), ("overfit_limit", overfit_limit)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be a finite number >= 0 (0 switches the rule off)")
            setattr(self, name, float(value))
        self.held_out, self.held_labels = _held_out(held_out, max_samples)
        self.d_chance: float | None = None  # D's loss with both logits at 0, from the run's loss
        self.real_diversity: float | None = None
        self.early_g: list[float] = []  # the first finite loss/G values
        self.streaks: dict[str, int] = {}  # consecutive rows a rule's condition has held
        self.warned: list[str] = []  # rules inside an episode that was already warned about
        self.diversity: list[list[float]] = []  # [step, value] of every measurement
        self.probe_reals: torch.Tensor | None = None  # D's probe of training reals (checkpointed: see setup)
        self.probe_labels: torch.Tensor | None = None
        self.d_probe: dict[str, float] = {}  # the last probe of D: its step and health/* values
        self.probes = 0  # D's probes so far (the first early_samples judge an untrained D: no rule applies)
        self.unlogged: dict[str, float] = {}  # measurements handed to the next metrics row, not yet in one
        self.warnings: list[str] = []  # every line printed (on every process), for tests and callers
        self.history: list[list[Any]] = []  # [step, rule, line] of every warning of the run (checkpointed)

    def setup(self, trainer: "GANTrainer") -> None:
        zeros = torch.zeros(2)
        self.d_chance = float(trainer.config.loss_fn.d_loss(zeros, zeros))
        reference = getattr(trainer, "reference_samples", None)
        if isinstance(reference, torch.Tensor) and reference.is_floating_point():
            self.real_diversity = sample_diversity(reference, self._classes(trainer, "reference_labels"),
                                                   self.max_samples)
            # The first batch of an unseeded shuffling loader differs from run to run, a resumed one included:
            # the checkpoint keeps the probe's reals (at most PROBE_REALS of them) so the probe goes on alike.
            labels = getattr(trainer, "reference_labels", None)
            self.probe_reals = reference[:PROBE_REALS].clone()
            self.probe_labels = None if labels is None else labels[:PROBE_REALS].clone()
        if self.held_out is not None:
            _check_held_out(self.held_out, self.held_labels, reference, trainer.conditioning.conditional)

    # -- events --------------------------------------------------------------------------------
    def on_fit_start(self, trainer: "GANTrainer") -> None:
        if self.unlogged:  # resumed after a measurement whose row had not been written yet
            trainer.control.log(dict(self.unlogged))

    def on_step_end(self, trainer: "GANTrainer") -> None:
        # Measured where the samples are taken, but before the step's metrics row: at a sample step that
        # is also a log step the values land in that very row (else in the next one).
        cfg = trainer.config
        if trainer.step % cfg.sample_every and trainer.step != cfg.max_steps:
            return
        value = sample_diversity(trainer.generate(), self._classes(trainer, "fixed_labels"),  # every process alike
                                 self.max_samples)
        self.unlogged = {DIVERSITY: value, **self._probe_d(trainer)}
        trainer.control.log(dict(self.unlogged))
        self._check_diversity(trainer, value)
        self._check_d_probe(trainer)

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        if DIVERSITY in row:
            self.unlogged = {}
        warned = len(self.history)
        self._check_d(trainer, row)
        self._check_g(trainer, row)
        if len(self.history) > warned or DIVERSITY in row:  # a new warning, or a new probe of D
            self.write_summary(trainer)

    def on_fit_end(self, trainer: "GANTrainer") -> None:
        self.write_summary(trainer)

    def write_summary(self, trainer: "GANTrainer") -> None:
        """``health.json`` in the run folder (main process; in events every process agrees on): D's last
        probe and every warning of the run, for ``gan-accel info``."""
        if trainer.accelerator.is_main_process:
            write_json(trainer.output_dir / HEALTH, self.summary())

    def summary(self) -> dict[str, Any]:
        """D's last probe (its step and ``health/*`` values), whether it has held-out images, and every
        warning of the run as ``{"step", "rule", "line"}``."""
        return {"d_probe": dict(self.d_probe), "held_out": 0 if self.held_out is None else len(self.held_out),
                "warnings": [{"step": step, "rule": rule, "line": line} for step, rule, line in self.history]}

    def _probe_d(self, trainer: "GANTrainer") -> dict[str, float]:
        """D's logits on the probe images -> the ``health/*`` values (none when there are no reference reals)."""
        if self.probe_reals is None or not len(self.probe_reals):
            return {}
        logits = probe_logits(trainer, self.probe_reals, self.probe_labels, self.held_out, self.held_labels)
        values = probe_statistics(logits["real"], logits["fake"], logits.get("held_out"))
        self.probes += 1
        self.d_probe = {"step": trainer.step, **values}
        return values

    @staticmethod
    def _classes(trainer: "GANTrainer", name: str) -> torch.Tensor | None:
        """The class labels ``trainer.<name>`` of a conditional run (diversity is then measured within a class)."""
        labels = getattr(trainer, name, None)
        return labels if trainer.conditioning.conditional and isinstance(labels, torch.Tensor) else None

    # -- the rules -------------------------------------------------------------------------------
    def _check_diversity(self, trainer: "GANTrainer", value: float) -> None:
        earlier = [v for _, v in self.diversity[:self.early_samples]]
        self.diversity.append([trainer.step, value])
        below = []  # the limits this measurement is under
        if earlier and value < self.diversity_drop * max(earlier):
            below.append(f"{self.diversity_drop:g} x its early peak {max(earlier):.3g}")
        # The floor only after the early measurements: an untrained G maps every latent to nearly the same
        # image (small weights), which is not a collapse; one that stays there is, and is caught then.
        if self.real_diversity is not None and len(earlier) >= self.early_samples and \
                value < self.diversity_floor * self.real_diversity:
            below.append(f"{self.diversity_floor:g} x the real data's {self.real_diversity:.3g}")
        within = " within a class" if trainer.conditioning.conditional else ""
        self._episode(trainer, "diversity", bool(below), 1, trainer.step, lambda: (
            f"{PREFIX} sample diversity collapsed at step {trainer.step}: G's samples of the fixed latents are "
            f"{value:.3g} apart on average{within}, below {' and '.join(below)}: G is producing near-identical samples "
            "(mode collapse). Try R1 (r1_gamma), a lower lr_G or a higher lr_D, n_critic > 1, the hinge loss, "
            "or resume from a checkpoint before the collapse."))

    def _check_d_probe(self, trainer: "GANTrainer") -> None:
        """The dead-D and the overfitting rules, on the probe just taken. Neither judges the first
        ``early_samples`` probes: a D at initialisation can be flat (small weights), and its logits say
        nothing yet about generalisation."""
        probe, step, n = self.d_probe, trainer.step, self.patience
        judged = self.probes > self.early_samples and "health/d_spread" in probe
        spread = probe.get("health/d_spread", math.nan)
        outputs = f"D(x)={probe.get('health/d_real', math.nan):.3g}, D(G(z))={probe.get('health/d_fake', math.nan):.3g}"
        self._episode(trainer, "d_dead", judged and bool(self.d_spread_floor) and spread < self.d_spread_floor, n,
                      step, lambda: (
            f"{PREFIX} D is dead: the spread of its logits over real and generated probe images has stayed below "
            f"{self.d_spread_floor:g} for {n} measurements (now {spread:.3g} at step {step}; {outputs}): its output "
            "no longer depends on its input, so G learns nothing. Try less augmentation (--augment ada or none; "
            "augment='ada' or 'none'), a lower learning rate (lr_D, lr_G) or a smaller R1/R2 gamma (r1_gamma, "
            "r2_gamma)."))
        overfit = probe.get("health/overfit")
        held = probe.get("health/d_heldout", math.nan)
        self._episode(trainer, "d_overfits", judged and bool(self.overfit_limit) and overfit is not None and
                      overfit > self.overfit_limit, n, step, lambda: (
            f"{PREFIX} D is overfitting its training images: real images it never trained on score "
            f"{probe['health/d_real'] - held:.3g} logits below the training images, {overfit:.2f} of the way to "
            f"G's samples (health/overfit above {self.overfit_limit:g} for {n} measurements, at step {step}; "
            f"D(train)={probe['health/d_real']:.3g}, D(held-out)={held:.3g}, D(G(z))={probe['health/d_fake']:.3g}): "
            "it memorises them rather than learning what real images look like. Try augmentation (--augment ada "
            "or diffaugment), a larger R1/R2 gamma (r1_gamma, r2_gamma), fewer steps (epochs) or more images."))

    def _check_d(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        value = row.get("loss/D")
        if not _number(value) or not self.d_chance or self.d_chance <= 0 or not self.d_loss_fraction:
            return
        limit = self.d_loss_fraction * self.d_chance
        outputs = ", ".join(f"{k}={row[k]:.3g}" for k in ("D(x)", "D(G(z))") if _number(row.get(k)))
        self._episode(trainer, "d_wins", value < limit, self.patience, row["step"], lambda: (
            f"{PREFIX} D is winning outright: loss/D has stayed below {limit:.3g} ({self.d_loss_fraction:g} x its "
            f"chance level {self.d_chance:.3g}) for {self.patience} log rows (now {value:.3g} at step {row['step']}"
            f"{'; ' + outputs if outputs else ''}), so G gets almost no gradient. Try a lower lr_D or a higher "
            "lr_G, n_critic=1, R1 (r1_gamma) or a smaller D."))

    def _check_g(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        value = row.get("loss/G")
        if not _number(value):
            return
        self._episode(trainer, "g_not_finite", not math.isfinite(value), 1, row["step"], lambda: (
            f"{PREFIX} G's loss is {value} at step {row['step']}: the run is diverging. Try lower learning "
            "rates, gradient clipping (clip_grad_norm_G, clip_grad_norm_D), bf16 instead of fp16, or resume "
            "from an earlier checkpoint."))
        if not math.isfinite(value):
            return
        if len(self.early_g) < self.early_rows:
            self.early_g.append(float(value))
            return
        median = statistics.median(self.early_g)
        limit = median + self.g_loss_factor * max(abs(median), 1.0)
        exploding = bool(self.g_loss_factor) and value > limit
        self._episode(trainer, "g_explodes", exploding, self.patience, row["step"], lambda: (
            f"{PREFIX} G's loss is exploding: loss/G has stayed above {limit:.3g} (its early median {median:.3g} "
            f"+ {self.g_loss_factor:g} x max(|median|, 1)) for {self.patience} log rows (now {value:.3g} at step "
            f"{row['step']}): D rejects G's samples with growing confidence. Try a lower lr_D or a higher lr_G, "
            "R1 (r1_gamma), clip_grad_norm_D, or resume from an earlier checkpoint."))

    def _episode(self, trainer: "GANTrainer", rule: str, holds: bool, needed: int, step: int,
                 message: Callable[[], str]) -> None:
        """Count a rule's consecutive hits; warn once when they reach ``needed``; a miss ends the episode."""
        if not holds:
            self.streaks[rule] = 0
            if rule in self.warned:
                self.warned.remove(rule)
            return
        self.streaks[rule] = self.streaks.get(rule, 0) + 1
        if self.streaks[rule] >= needed and rule not in self.warned:
            self.warned.append(rule)
            line = message()
            self.warnings.append(line)
            self.history.append([step, rule, line])
            trainer.accelerator.print(line)

    # -- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"early_g": list(self.early_g), "streaks": dict(self.streaks), "warned": list(self.warned),
                "diversity": [list(m) for m in self.diversity], "unlogged": dict(self.unlogged),
                "real_diversity": self.real_diversity, "d_probe": dict(self.d_probe), "probes": self.probes,
                "history": [list(w) for w in self.history], "probe_reals": self.probe_reals,
                "probe_labels": self.probe_labels}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.early_g, self.streaks, self.warned = list(state["early_g"]), dict(state["streaks"]), list(state["warned"])
        self.diversity, self.real_diversity = [list(m) for m in state["diversity"]], state["real_diversity"]
        unlogged = state["unlogged"]  # a checkpoint of a run that measured diversity alone holds one number
        self.unlogged = dict(unlogged) if isinstance(unlogged, dict) else {} if unlogged is None else \
            {DIVERSITY: unlogged}
        self.d_probe, self.probes = dict(state.get("d_probe", {})), int(state.get("probes", 0))
        self.history = [list(w) for w in state.get("history", [])]
        if isinstance(state.get("probe_reals"), torch.Tensor):  # a checkpoint from before the probe: keep setup's
            self.probe_reals, self.probe_labels = state["probe_reals"], state.get("probe_labels")


def _held_out(held_out: Any, limit: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``HealthMonitor(held_out=...)`` as (images, labels), each cut to ``limit`` rows and on the CPU."""
    if held_out is None:
        return None, None
    images, labels = held_out if isinstance(held_out, (tuple, list)) and len(held_out) == 2 else (held_out, None)
    if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.dim() < 2 or not len(images):
        raise ValueError("held_out must be a floating-point tensor of real images shaped like the training samples "
                         "(N, ...) with N >= 1, in the range G produces, or (images, labels) in a conditional run; "
                         f"got {type(images).__name__} {tuple(getattr(images, 'shape', ()))}")
    if labels is not None and (not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point or
                               labels.shape != images.shape[:1]):
        raise ValueError("held_out's labels must be an integer tensor of class indices, one per image (shape "
                         f"({images.shape[0]},)); got {getattr(labels, 'dtype', type(labels).__name__)} "
                         f"{tuple(getattr(labels, 'shape', ()))}")
    return images.detach()[:limit].cpu(), None if labels is None else labels.detach()[:limit].cpu()


def _check_held_out(images: torch.Tensor, labels: torch.Tensor | None, reference: Any, conditional: bool) -> None:
    """The held-out images against the run: the training samples' shape, and labels exactly when conditional."""
    if isinstance(reference, torch.Tensor) and images.shape[1:] != reference.shape[1:]:
        raise ConfigError(f"held_out images are shaped {tuple(images.shape[1:])} but the training samples "
                         f"{tuple(reference.shape[1:])}: pass held-out images prepared like the training ones")
    if conditional and labels is None:
        raise ConfigError("a conditional run's D needs the held-out images' labels: pass "
                         "HealthMonitor(held_out=(images, labels))")
    if not conditional and labels is not None:
        raise ConfigError("held_out has labels but the run is unconditional: pass the images alone")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
