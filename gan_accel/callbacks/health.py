"""Training health: one warning line per episode when a run fails in a recognisable way (D wins outright,
G's loss explodes, the samples' diversity collapses), and ``health/diversity`` in the metrics.

The rules and their defaults are in docs/health-and-trackers.md. A rule warns when its condition starts to
hold and is silent until one healthy row or measurement ends the episode. The state is checkpointed, so a
resumed run warns exactly where the uninterrupted one would.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Callable

import torch

from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

DIVERSITY = "health/diversity"
PREFIX = "gan_accel: warning:"


def mean_pairwise_distance(samples: torch.Tensor, limit: int | None = None) -> float:
    """Mean Euclidean distance between the (flattened) samples of a batch, over all pairs (NaN under 2)."""
    flat = samples.detach().float().reshape(samples.shape[0], -1)[:limit]
    return float(torch.pdist(flat).mean()) if len(flat) > 1 else math.nan


class HealthMonitor(Callback):
    """Warns once per episode when D wins outright, G's loss explodes or the samples' diversity
    collapses; logs ``health/diversity`` (the rules: docs/health-and-trackers.md)."""

    def __init__(self, *, patience: int = 3, d_loss_fraction: float = 0.05, g_loss_factor: float = 3.0,
                 early_rows: int = 5, diversity_drop: float = 0.5, diversity_floor: float = 0.1,
                 early_samples: int = 3, max_samples: int = 64) -> None:
        for name, value, least in (("patience", patience, 1), ("early_rows", early_rows, 1),
                                   ("early_samples", early_samples, 1), ("max_samples", max_samples, 2)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
        for name, value in (("d_loss_fraction", d_loss_fraction), ("g_loss_factor", g_loss_factor),
                            ("diversity_drop", diversity_drop), ("diversity_floor", diversity_floor)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be a finite number >= 0 (0 switches the rule off)")
        self.patience, self.early_rows, self.early_samples, self.max_samples = patience, early_rows, early_samples, \
            max_samples
        self.d_loss_fraction, self.g_loss_factor = float(d_loss_fraction), float(g_loss_factor)
        self.diversity_drop, self.diversity_floor = float(diversity_drop), float(diversity_floor)
        self.d_chance: float | None = None  # D's loss with both logits at 0, from the run's loss
        self.real_diversity: float | None = None
        self.early_g: list[float] = []  # the first finite loss/G values
        self.streaks: dict[str, int] = {}  # consecutive rows a rule's condition has held
        self.warned: list[str] = []  # rules inside an episode that was already warned about
        self.diversity: list[list[float]] = []  # [step, value] of every measurement
        self.unlogged: float | None = None  # a measurement handed to the next metrics row, not yet in one
        self.warnings: list[str] = []  # every line printed (on every process), for tests and callers

    def setup(self, trainer: "GANTrainer") -> None:
        zeros = torch.zeros(2)
        self.d_chance = float(trainer.config.loss_fn.d_loss(zeros, zeros))
        reference = getattr(trainer, "reference_samples", None)
        if isinstance(reference, torch.Tensor) and reference.is_floating_point():
            self.real_diversity = mean_pairwise_distance(reference, self.max_samples)

    # -- events --------------------------------------------------------------------------------
    def on_fit_start(self, trainer: "GANTrainer") -> None:
        if self.unlogged is not None:  # resumed after a measurement whose row had not been written yet
            trainer.control.log({DIVERSITY: self.unlogged})

    def on_step_end(self, trainer: "GANTrainer") -> None:
        # Measured where the samples are taken, but before the step's metrics row: at a sample step that
        # is also a log step the value lands in that very row (else in the next one).
        cfg = trainer.config
        if trainer.step % cfg.sample_every and trainer.step != cfg.max_steps:
            return
        value = mean_pairwise_distance(trainer.generate(), self.max_samples)  # every process: the same weights
        self.unlogged = value
        trainer.control.log({DIVERSITY: value})
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
        self._episode(trainer, "diversity", bool(below), 1, lambda: (
            f"{PREFIX} sample diversity collapsed at step {trainer.step}: G's samples of the fixed latents are "
            f"{value:.3g} apart on average, below {' and '.join(below)}: G is producing near-identical samples "
            "(mode collapse). Try R1 (r1_gamma), a lower lr_G or a higher lr_D, n_critic > 1, the hinge loss, "
            "or resume from a checkpoint before the collapse."))

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        if DIVERSITY in row:
            self.unlogged = None
        self._check_d(trainer, row)
        self._check_g(trainer, row)

    # -- the rules -------------------------------------------------------------------------------
    def _check_d(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        value = row.get("loss/D")
        if not _number(value) or not self.d_chance or self.d_chance <= 0 or not self.d_loss_fraction:
            return
        limit = self.d_loss_fraction * self.d_chance
        outputs = ", ".join(f"{k}={row[k]:.3g}" for k in ("D(x)", "D(G(z))") if _number(row.get(k)))
        self._episode(trainer, "d_wins", value < limit, self.patience, lambda: (
            f"{PREFIX} D is winning outright: loss/D has stayed below {limit:.3g} ({self.d_loss_fraction:g} x its "
            f"chance level {self.d_chance:.3g}) for {self.patience} log rows (now {value:.3g} at step {row['step']}"
            f"{'; ' + outputs if outputs else ''}), so G gets almost no gradient. Try a lower lr_D or a higher "
            "lr_G, n_critic=1, R1 (r1_gamma) or a smaller D."))

    def _check_g(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        value = row.get("loss/G")
        if not _number(value):
            return
        self._episode(trainer, "g_not_finite", not math.isfinite(value), 1, lambda: (
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
        self._episode(trainer, "g_explodes", bool(self.g_loss_factor) and value > limit, self.patience, lambda: (
            f"{PREFIX} G's loss is exploding: loss/G has stayed above {limit:.3g} (its early median {median:.3g} "
            f"+ {self.g_loss_factor:g} x max(|median|, 1)) for {self.patience} log rows (now {value:.3g} at step "
            f"{row['step']}): D rejects G's samples with growing confidence. Try a lower lr_D or a higher lr_G, "
            "R1 (r1_gamma), clip_grad_norm_D, or resume from an earlier checkpoint."))

    def _episode(self, trainer: "GANTrainer", rule: str, holds: bool, needed: int, message: Callable[[], str]) -> None:
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
            trainer.accelerator.print(line)

    # -- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"early_g": list(self.early_g), "streaks": dict(self.streaks), "warned": list(self.warned),
                "diversity": [list(m) for m in self.diversity], "unlogged": self.unlogged,
                "real_diversity": self.real_diversity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.early_g, self.streaks, self.warned = list(state["early_g"]), dict(state["streaks"]), list(state["warned"])
        self.diversity, self.unlogged = [list(m) for m in state["diversity"]], state["unlogged"]
        self.real_diversity = state["real_diversity"]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
