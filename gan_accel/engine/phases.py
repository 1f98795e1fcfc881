"""The training step as data: a list of phases, and which of them are due at each step.

A :class:`Phase` is one optimizer update of one network; one *step* is one pass over the list. A phase
with ``new_data=True`` starts a new *window* (``grad_accum_steps`` fresh micro-batches); the others reuse
it, so G trains on the latents D just saw. ``every`` counts occurrences of the phase's *name* in the list
(the first runs); the counters are part of the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from torch import Tensor

from ..errors import PhaseError
from ..objectives.adversarial import discriminator_loss, generator_loss, sum_losses
from ..objectives.regularizers import gradient_penalty, r1_penalty, r2_penalty

if TYPE_CHECKING:
    from ..config import TrainConfig
    from .context import StepContext

PhaseLoss = Callable[["StepContext"], Tensor]

# GENERATOR makes the samples (``ctx.fake``), so its phases see them with their graph.
GENERATOR, DISCRIMINATOR = "G", "D"


@dataclass(frozen=True)
class Phase:
    """One optimizer update of one network.

    Args:
        name: unique in the list (several list entries may be the *same* phase, e.g. D x n_critic);
            its loss is logged as ``loss/<name>``.
        net: the network this phase updates: ``"G"``, ``"D"``, or the name of an extra network.
        loss: ``loss(ctx) -> scalar``, the mean over the micro-batch (see ``StepContext``).
        every: run on every ``every``-th occurrence of this phase (1 = always).
        gain: the loss is multiplied by this before backward (lazy regularisation uses ``every``).
        tick_scheduler: whether this update advances the network's learning-rate schedule.
        new_data: this phase draws a fresh window of real batches and latents.
        double_backward: the loss differentiates through a gradient (R1, gradient penalty): it is
            run on the eager module even when G and D are compiled.
    """

    name: str
    net: str
    loss: PhaseLoss
    every: int = 1
    gain: float = 1.0
    tick_scheduler: bool = True
    new_data: bool = False
    double_backward: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise PhaseError(f"phase name {self.name!r} is invalid: use a non-empty name without '/'")
        if not isinstance(self.net, str) or not self.net:
            raise PhaseError(f"phase {self.name!r}: net={self.net!r} must name a network ('G', 'D' or an extra one)")
        if not callable(self.loss):
            raise PhaseError(f"phase {self.name!r}: loss must be a function of the step context, got {self.loss!r}")
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise PhaseError(f"phase {self.name!r}: every={self.every!r} must be an integer >= 1")
        if isinstance(self.gain, bool) or not isinstance(self.gain, (int, float)) or not math.isfinite(self.gain) \
                or self.gain <= 0:
            raise PhaseError(f"phase {self.name!r}: gain={self.gain!r} must be a finite number > 0")


def r1_phase(gamma: float | None, every: int = 16, name: str | None = None, r2_gamma: float | None = None) -> Phase:
    """Lazy R1 (StyleGAN2): every ``every``-th D step, loss gain ``every``, no scheduler tick; with
    ``r2_gamma`` also R2 on G's samples (named ``"R1R2"``, or ``"R2"`` with ``gamma=None``)."""
    terms = ([r1_penalty(gamma)] if gamma else []) + ([r2_penalty(r2_gamma)] if r2_gamma else [])
    if not terms:
        raise PhaseError("r1_phase needs gamma > 0 (R1), r2_gamma > 0 (R2) or both")
    name = name or "R1" * bool(gamma) + "R2" * bool(r2_gamma)
    return Phase(name=name, net=DISCRIMINATOR, loss=sum_losses(*terms) if len(terms) > 1 else terms[0], every=every,
                 gain=float(every), tick_scheduler=False, double_backward=True)


def default_phases(config: "TrainConfig") -> list[Phase]:
    """The phase list a :class:`~gan_accel.TrainConfig` describes: D ``n_critic`` times (with WGAN-GP, and R1/R2
    from D's own forwards when ``r1_every=1``), a lazy R1/R2 phase after each D when ``r1_every > 1``, then G."""
    lazy = config.r1_every > 1 and bool(config.r1_gamma or config.r2_gamma)
    gammas = (0.0, 0.0) if config.r1_every > 1 else (config.r1_gamma or 0.0, config.r2_gamma or 0.0)
    d_loss = discriminator_loss(config.loss_fn, config.class_loss_weight, *gammas)
    if config.gp_weight:
        d_loss = sum_losses(d_loss, gradient_penalty(config.gp_weight))
    d_phase = Phase(DISCRIMINATOR, DISCRIMINATOR, d_loss, new_data=True,
                    double_backward=bool(config.gp_weight) or any(gammas))
    penalties = r1_phase(config.r1_gamma, config.r1_every, r2_gamma=config.r2_gamma) if lazy else None
    phases: list[Phase] = []
    for _ in range(config.n_critic):
        phases += [d_phase, penalties] if penalties is not None else [d_phase]
    phases.append(Phase(GENERATOR, GENERATOR, generator_loss(config.loss_fn, config.class_loss_weight)))
    return phases


class PhasePlan:
    """A validated phase list and the counters that decide which phases are due."""

    def __init__(self, phases: Sequence[Phase], networks: Iterable[str]) -> None:
        phases = list(phases)
        networks = list(networks)
        if not phases:
            raise PhaseError("the phase list is empty: pass at least one phase (see gan_accel.default_phases)")
        by_name: dict[str, Phase] = {}
        for phase in phases:
            if not isinstance(phase, Phase):
                raise PhaseError(f"phases must be gan_accel.Phase objects, got {type(phase).__name__}")
            if phase.net not in networks:
                raise PhaseError(f"phase {phase.name!r} updates network {phase.net!r}, which the trainer does not "
                                 f"have: networks are {networks} (pass extra ones with extra_networks=)")
            if by_name.setdefault(phase.name, phase) != phase:
                raise PhaseError(f"two different phases are named {phase.name!r}: give each its own name")
        if not phases[0].new_data:
            raise PhaseError(f"the first phase ({phases[0].name!r}) must draw data (new_data=True): the phases "
                             "after it reuse its real batch and latents")
        self.phases = tuple(phases)
        self.occurrences = {name: 0 for name in by_name}  # times each phase came up in the list, run or not

    def advance(self) -> list[Phase]:
        """The phases due in this step, in order; counts every occurrence (call once per step)."""
        due = []
        for phase in self.phases:
            if self.occurrences[phase.name] % phase.every == 0:
                due.append(phase)
            self.occurrences[phase.name] += 1
        return due

    def scheduler_steps(self, net: str, max_steps: int) -> int:
        """How many scheduler-ticking updates ``net`` makes in ``max_steps`` steps (its schedule's length)."""
        total = 0
        for name, phase in {p.name: p for p in self.phases}.items():
            if phase.net == net and phase.tick_scheduler:
                occurrences = sum(p.name == name for p in self.phases) * max_steps
                total += -(-occurrences // phase.every)  # the first occurrence runs: ceil
        return total

    def describe(self) -> str:
        """The list in one line, for logs."""
        return ", ".join(p.name + (f"/{p.every}" if p.every > 1 else "") for p in self.phases)

    def state_dict(self) -> dict[str, Any]:
        return {"occurrences": dict(self.occurrences)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["occurrences"]
        unknown = set(saved) - set(self.occurrences)
        if unknown:
            raise PhaseError(f"the checkpoint's phases {sorted(unknown)} are not in this run's phase list "
                             f"({self.describe()}): resume with the phases that wrote it")
        self.occurrences.update(saved)
