"""``--label NAME_OR_INDEX`` of ``gan-accel sample``: a class of a conditional run, by name or by index.

A run trained on class folders (or a dataset's class column) keeps its class names (in label order), and its
generator carries them (``G.class_names``). A name of that list is its index (names first: a folder named ``3`` is the class named
``3``, whatever its index); otherwise a whole number is an index; anything else is one line listing a
few of the run's classes.
"""

from __future__ import annotations

import argparse
import re
from torch import nn

from ..errors import ConfigError
from .common import CommandError

SHOWN = 8


def label_argument(text: str) -> str:
    """The argparse type of ``--label``: any name, but a negative number is refused as such."""
    if re.fullmatch(r"\s*-\d+\s*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return text


def resolve_label(text: str | None, G: nn.Module) -> int | None:
    """The class index ``--label`` names for ``G`` (see the module docstring); None when not given."""
    if text is None:
        return None
    count = getattr(G, "num_classes", None)
    if count is None:
        raise ConfigError("this run is unconditional (no num_classes): it cannot sample a chosen class; "
                          "leave out the label")
    names = G.class_names
    if names and text in names:
        return names.index(text)
    if text.strip().isdigit():
        return int(text)
    if not names:
        raise CommandError(f"--label {text!r}: this run keeps no class names, only indices: pass a class index "
                           f"0..{count - 1}")
    shown = ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
    raise CommandError(f"--label {text!r} is not a class of this run (its {count} classes: {shown}): pass one of "
                       f"their names or an index 0..{count - 1}")
