"""The lists that help texts and the docs show, written from the registries: the losses
(:data:`gan_accel.objectives.LOSSES`), the model families with their sizes, latent sizes and widths
(:data:`gan_accel.models.FAMILIES`) and the family the recipe picks at each size
(:func:`gan_accel.recipes.family_for`). A loss or a family added to a registry shows in ``--help`` at once, and
tests/test_choices.py fails until docs/config.md and docs/cli.md list it too.
"""

from __future__ import annotations

from collections import Counter
from itertools import groupby
from typing import Any, Sequence

from ..models import FAMILIES
from ..objectives import LOSSES
from ..recipes import family_for


def spoken(items: Sequence[Any], last: str = "or") -> str:
    """``a, b or c``."""
    words = [str(item) for item in items]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def loss_names() -> str:
    """Every loss by name, the relativistic ones said so: ``nonsaturating, hinge, ... or rpgan (relativistic pairing)``."""
    return spoken([f"{name} (relativistic pairing)" if loss.relativistic else name for name, loss in LOSSES.items()])


def family_sizes() -> str:
    """The sizes each family makes, families of the same sizes together: ``dcgan 28, 32 or 64 px; resnet and ...``."""
    by_sizes: dict[tuple[int, ...], list[str]] = {}
    for name, family in FAMILIES.items():
        by_sizes.setdefault(family.resolutions, []).append(name)
    return "; ".join(f"{spoken(names, 'and')} {spoken(sizes)} px" for sizes, names in by_sizes.items())


def z_defaults() -> str:
    """Each family's default latent size: ``dcgan 100, resnet 128, r3gan 64``."""
    return ", ".join(f"{name} {family.default_z_dim}" for name, family in FAMILIES.items())


def default_width(name: str) -> str:
    """A family's default width over its sizes: ``64``, or ``32 at 28 px, else 64``."""
    family = FAMILIES[name]
    widths = {size: family.default_width(size) for size in family.resolutions}
    usual = Counter(widths.values()).most_common(1)[0][0]
    others = [f"{width} at {size} px" for size, width in widths.items() if width != usual]
    return f"{', '.join(others)}, else {usual}" if others else str(usual)


def recipe_families(gpu: bool) -> str:
    """The family the recipe picks at each size: ``dcgan at 28 to 64 px, resnet at 128 to 256 px``."""
    every_size = sorted({size for family in FAMILIES.values() for size in family.resolutions})
    runs = [(family, list(sizes)) for family, sizes in groupby(every_size, lambda size: family_for(size, gpu))]
    return ", ".join(f"{family} at {sizes[0]} px" if len(sizes) == 1 else f"{family} at {sizes[0]} to {sizes[-1]} px"
                     for family, sizes in runs)


def families_table() -> str:
    """docs/cli.md's table of the families: the sizes each makes, its default latent size and width."""
    rows = ["| `--model` | `--resolution` | `--z-dim` (the family's default) | `--width` (the family's default) |",
            "| --- | --- | --- | --- |"]
    rows += [f"| `{name}` | {spoken(family.resolutions)} | {family.default_z_dim} | {default_width(name)} |"
             for name, family in FAMILIES.items()]
    return "\n".join(rows)
