"""The defaults `gan-accel train` takes for every setting the user leaves out, chosen by the resolution, the
number of images and whether the run is conditional.

Up to 32 px the table was measured on 2 CPU cores (``benchmarks/own_images_quality.py``; the numbers are
in docs/benchmarks.md): a DCGAN of width 32 with the relativistic pairing loss (RpGAN) and its two
zero-centred penalties, R1 and R2, beats the MNIST recipe and the classic DCGAN loop at equal wall time.
From 64 px, on a GPU, the recipe is R3GAN's published one (its network, loss, penalties and optimiser
settings; ``benchmarks/gpu_check.py`` measures it first where a GPU is lent); on a CPU, where that
network would take hours, the 32-px row carries over with the family that makes the size (dcgan of
width 32 at 64 px, measured on 531 icons; resnet above, not measured).

The penalty's gamma follows the resolution: measured at 28-32 px, and at 64 px and above R3GAN's
published values, 2 at 64 px and 150 at 256 px, between which it grows as a power of the side,
``2 * (side / 64) ** 3.11`` (17.3 at 128 px); on a GPU it ramps down tenfold over the run, as R3GAN's does.
On a CPU the 64-px row takes R3GAN's 2 as well (on 531 icons at 64 px it beat the 32-px row's 0.1 on two
seeds, and D stopped winning outright), and the unmeasured rows above keep it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import Ramp
from .errors import ConfigError

SMALL_SIDES = (28, 32)  # the measured rows; larger sides take the published recipe
CPU_WIDTH_32_UP_TO = 64  # on a CPU, dcgan of width 32 up to this side (see default_recipe)
CPU_GAMMA_FROM = 64  # on a CPU, rows of this side and above take its published gamma (measured there, on icons)


@dataclass(frozen=True)
class Recipe:
    """What `gan-accel train` uses for the flags left out (each field is the flag of the same name)."""

    model: str
    width: int | None  # None: the family's default width
    loss: str
    r1_gamma: float
    r2_gamma: float
    r1_every: int  # the penalties every N-th D step, their loss times N
    lr: float  # G's and D's
    beta1: float
    beta2: float
    ema_decay: float
    augment: str
    steps: int
    source: str  # where the row comes from: "measured on 2 CPU cores" or the publication
    # Settings that ramp (cosine) from the value above to this one over the run's images, as R3GAN's do:
    # "lr", "beta2", "gamma" (R1 and R2), "augment_p" (from 0).
    ramp_to: dict[str, float] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """The row's value of each flag it fills, by the flag's name (``lr_g``, ``r1_gamma``, ...)."""
        return {"model": self.model, "width": self.width, "loss": self.loss, "r1_gamma": self.r1_gamma,
                "r2_gamma": self.r2_gamma, "r1_every": self.r1_every, "lr_g": self.lr, "lr_d": self.lr,
                "beta1": self.beta1, "beta2": self.beta2, "ema_decay": self.ema_decay, "augment": self.augment}

    def describe(self, settled: Mapping[str, Any] | None = None, marks: Mapping[str, str] | None = None) -> str:
        """One line for the run's log: what the run uses and where it comes from. ``settled``: the run's values
        by flag name (those missing are the row's); ``marks``: the source of each value that is not the row's
        (``flag``, ``resume``, ...), shown after it; those no longer ramp."""
        values = {**self.settings(), **(settled or {})}
        marks = marks or {}

        def shown(names: tuple[str, ...], text: str, ramp: str = "") -> str:
            mark = next((marks[name] for name in names if name in marks), None)
            if mark:  # a value chosen instead of the row's, ramp included (ramps)
                return f"{text} ({mark})"
            end = self.ramp_to.get(ramp)
            return f"{text} -> {end:g}" if end is not None else text

        def pair(first: str, second: str, both: str, one: str, two: str, ramp: str) -> str:
            """G's and D's (R1's and R2's) value as one when they agree, else each (None: not used)."""
            a, b = values[first], values[second]
            if a == b and marks.get(first) == marks.get(second):
                return shown((first,), f"{both} {a:g}", ramp)
            return ", ".join(shown((name,), f"{label} {value:g}", ramp)
                             for name, label, value in ((first, one, a), (second, two, b)) if value is not None)

        width = f" width {values['width']}" if values["width"] else ""
        model = shown(("model", "width"), f"{values['model']}{width}")
        gamma = "no R1/R2" if not values["r1_gamma"] and not values["r2_gamma"] else \
            pair("r1_gamma", "r2_gamma", "R1/R2 gamma", "R1 gamma", "R2 gamma", "gamma")
        betas = f"{shown(('beta1',), format(values['beta1'], 'g'))}, " \
                f"{shown(('beta2',), format(values['beta2'], 'g'), 'beta2')}"
        return (f"{model}, {shown(('loss',), values['loss'] + ' loss')} with {gamma}, "
                f"{pair('lr_g', 'lr_d', 'lr', 'lr G', 'lr D', 'lr')}, betas ({betas}), "
                f"{shown(('augment',), 'augment ' + values['augment'])} ({self.source})")

    def ramps(self, total_images: float, given: Collection[str]) -> dict[str, Ramp]:
        """The config fields that ramp over ``total_images`` (the run's), leaving out the settings in ``given``."""
        # config field: (the ramp_to key, the start, the flags that set it by hand)
        fields = {"lr_G": ("lr", self.lr, {"lr_g"}), "lr_D": ("lr", self.lr, {"lr_d"}),
                  "r1_gamma": ("gamma", self.r1_gamma, {"r1_gamma"}), "r2_gamma": ("gamma", self.r2_gamma, {"r2_gamma"}),
                  "beta2": ("beta2", self.beta2, {"beta2"}), "augment_p": ("augment_p", 0.0, {"augment_p", "augment"})}
        return {name: Ramp(start, self.ramp_to[key], total_images) for name, (key, start, flags) in fields.items()
                if key in self.ramp_to and not flags & set(given)}


def penalty_gamma(side: int) -> float:
    """The R1/R2 gamma for images of ``side`` pixels (see the module's docstring)."""
    if side <= max(SMALL_SIDES):
        return 0.1
    return round(2.0 * (side / 64) ** math.log(75, 4), 2)  # through R3GAN's 2 at 64 px and 150 at 256 px


def family_for(side: int, gpu: bool) -> str:
    """The model family the table picks for ``side`` px (on a GPU or not)."""
    if side <= max(SMALL_SIDES):
        return "dcgan"
    return "r3gan" if gpu else "dcgan" if side <= 64 else "resnet"


def default_recipe(side: int, images: int, gpu: bool = False, classes: int | None = None) -> Recipe:
    """The table's row for ``side`` px images, ``images`` of them in ``classes`` classes (None: an unconditional
    run); augmentation pays on small sets, and a conditional D judges each class on that class's images alone."""
    if side < 1 or images < 1:
        raise ConfigError(f"a recipe needs a positive side and image count, got {side} px and {images} images")
    augment = "diffaugment" if classes and images / classes <= FEW_IMAGES else "ada" if images <= FEW_IMAGES else "none"
    family = family_for(side, gpu)
    if family != "r3gan":
        gamma = penalty_gamma(min(side, CPU_GAMMA_FROM))  # 0.1 up to 32 px, 2 from 64 px
        # Width 32 up to 64 px: at 64 px it keeps the default 6,000 steps near 30 minutes on 2 cores (width 64:
        # about 4 hours), the time a CPU user can wait for a first model.
        return Recipe(model=family, width=32 if side <= CPU_WIDTH_32_UP_TO else None, loss="rpgan", r1_gamma=gamma,
                      r2_gamma=gamma, r1_every=16, lr=3e-3, beta1=0.5, beta2=0.99, ema_decay=0.99, augment=augment,
                      steps=6000, source=_cpu_source(side))
    gamma = penalty_gamma(side)
    return Recipe(model="r3gan", width=None, loss="rpgan", r1_gamma=gamma, r2_gamma=gamma, r1_every=1, lr=2e-4,
                  beta1=0.0, beta2=0.9, ema_decay=0.999, augment="diffaugment", steps=20000,
                  source="R3GAN's published recipe, for a GPU",
                  ramp_to={"lr": 5e-5, "beta2": 0.99, "gamma": gamma / 10, "augment_p": 0.3})


def _cpu_source(side: int) -> str:
    """Where a CPU row comes from, for the run's recipe line."""
    if side <= max(SMALL_SIDES):
        return "measured on 2 CPU cores"
    if side <= CPU_WIDTH_32_UP_TO:
        return "the 32-px row's settings with R3GAN's gamma for 64 px, measured at 64 px on one icon set"
    return "the 64-px row's settings, not measured at this size"


# At or below: ADA by default, its p steered by how surely D tells real from fake. Measured on 100 icons and 100
# coloured digits (docs/models-and-augmentation.md): fixed DiffAugment at p = 1 beats no augmentation there but
# can leave D unable to tell real from fake, which ADA undoes by lowering p; at 500 images any augmentation lost
# (3,000 steps). 200 lies between the measured sizes, the crossover itself is not measured. A conditional run
# with at most this many images per class takes fixed DiffAugment: on the 531 icons in 9 categories (59 a class)
# the unaugmented conditional G drew one image per class and ADA did little better (docs/models-and-augmentation.md).
FEW_IMAGES = 200
