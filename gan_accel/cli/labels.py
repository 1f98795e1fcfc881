"""``--label NAME_OR_INDEX`` of ``gan-accel sample``: a class of a conditional run, by name or by index.

A run trained on class folders (or a dataset's class column) keeps its class names (in label order), and its
generator carries them (``G.class_names``). ``name:TEXT`` is always a name and ``index:N`` always an index.
A plain value that is one of the names is that class, even when it is also a number (a folder named ``1``
is the class named ``1``, whatever its index); when that number is the index of another class, one note
line says which was taken. A plain whole number that is no name is an index, except in a run whose classes
are named by numbers: there it is refused, asking for ``name:`` or ``index:``, since either reading could
be meant. Anything else is one line listing a few of the run's classes.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable

from torch import nn

from ..errors import ConfigError
from ..text import printable
from .common import CommandError

SHOWN = 8
_NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: "³" or "٣" is no index


def label_argument(text: str) -> str:
    """The argparse type of ``--label``: any name, but a negative number is refused as such."""
    if re.fullmatch(r"\s*(index:)?\s*-\d+\s*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return text


def label_name(index: int, G: nn.Module) -> str:
    """How a line names class ``index`` of ``G``: ``class 3`` or ``class 3 ('owls')`` (escaped)."""
    names = getattr(G, "class_names", None)
    return f"class {index}" + (f" ({printable(repr(names[index]))})" if names and 0 <= index < len(names) else "")


def _index(text: str, count: int, flag: str) -> int:
    if not _NUMBER.fullmatch(text):
        raise CommandError(f"{flag} is not a class index: pass a whole number 0..{count - 1} (ASCII digits)")
    if int(text) >= count:
        raise CommandError(f"{flag}: this run has {count} classes, indexed 0..{count - 1}")
    return int(text)


def resolve_label(text: str | None, G: nn.Module, log: Callable[[str], Any] | None = print) -> int | None:
    """The class index ``--label`` names for ``G`` (see the module docstring); None when not given. ``log``
    gets the note when a name that is also a number is taken as the name."""
    if text is None:
        return None
    count = getattr(G, "num_classes", None)
    if count is None:
        raise ConfigError("this run is unconditional (no num_classes): it cannot sample a chosen class; "
                          "leave out the label")
    names = list(getattr(G, "class_names", None) or [])
    flag = f"--label {printable(repr(text))}"
    shown = ", ".join(map(repr, names[:SHOWN])) + (", ..." if len(names) > SHOWN else "")
    if text.startswith("index:"):
        return _index(text[6:].strip(), count, flag)
    if text.startswith("name:"):
        if text[5:] in names:
            return names.index(text[5:])
        raise CommandError(f"{flag} is not a class name of this run ({count} classes: {shown or 'it keeps no names'}): "
                           "pass one of them after name:")
    number = text.strip()
    if text in names:
        index = names.index(text)
        if _NUMBER.fullmatch(number) and int(number) != index and int(number) < count and log is not None:
            log(printable(f"note: --label {text} is the class named {text!r} (index {index}), not the class at index "
                          f"{number} ({names[int(number)]!r}): pass index:{number} for that one"))
        return index
    if _NUMBER.fullmatch(number):
        if not names:
            return int(number)  # an index; one out of range is refused with the sampling request
        if int(number) >= count:
            raise CommandError(f"{flag} is neither a class name of this run ({count} classes: {shown}) nor one of "
                               f"its indices 0..{count - 1}")
        if any(_NUMBER.fullmatch(name.strip()) for name in names):
            raise CommandError(f"{flag} is no class name of this run, whose classes are named by numbers ({shown}): "
                               f"pass name:NAME for a class by its name, or index:{number} for the class at index "
                               f"{number} ({names[int(number)]!r})")
        return int(number)
    if not names:
        raise CommandError(f"{flag}: this run keeps no class names, only indices: pass a class index 0..{count - 1}")
    raise CommandError(f"{flag} is not a class of this run (its {count} classes: {shown}): pass one of "
                       f"their names or an index 0..{count - 1}")
