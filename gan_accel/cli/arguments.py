"""The command line's argument parser and number types, shared by ``gan-accel`` and the example scripts.

A bad flag is one ``error:`` line, exit 2 (``--epochs 0`` is refused by the parser, not by a traceback
later); :func:`gan_accel.ending.run_script` does the same for every other expected failure.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Callable, NoReturn

from ..config import MAX_SEED
from ..ending import _prints


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one ``error:`` line (exit 2) and that has ``--debug``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", help="show the full traceback of any error")

    def error(self, message: str) -> NoReturn:
        if _prints():
            print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _number(kind: type, minimum: float, inclusive: bool, words: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {words}") from None
        if value != value or value in (float("inf"), float("-inf")) or value < minimum or \
                (not inclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"{text!r} is not {words}")
        return value

    parse.__name__ = words  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, True, "a whole number >= 1")
nonnegative_int = _number(int, 0, True, "a whole number >= 0")


def bounded_int(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """A whole number in [low, high]: a size the parser refuses before any memory is allocated for it."""
    check = _number(int, low, True, f"a whole number >= {low}")

    def parse(text: str) -> int:
        value = check(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {high:,}, the largest allowed" +
                                             (f" ({why})" if why else ""))
        return value

    parse.__name__ = f"a whole number from {low} to {high:,}"
    return parse


seed_int = bounded_int(0, MAX_SEED, "what numpy and torch both accept as a seed")
positive_float = _number(float, 0.0, False, "a number > 0")
nonnegative_float = _number(float, 0.0, True, "a number >= 0")


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    value = nonnegative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1)")
    return value


_NUMBER = r"(\d+(?:\.\d+)?)\s*"
# Strict: a bare number of seconds alone, or numbers each with its unit, the larger units first, each once
# (``1..5``, ``1h30`` and ``30m1h`` are refused: a limit read otherwise than meant costs a whole run).
_DURATION = re.compile(rf"{_NUMBER}|(?:{_NUMBER}d\s*)?(?:{_NUMBER}h\s*)?(?:{_NUMBER}(?:min|m)\s*)?(?:{_NUMBER}s)?")
_UNIT_SECONDS = (1.0, 86400.0, 3600.0, 60.0, 1.0)  # the groups of _DURATION in order


def duration(text: str) -> float:
    """Seconds from ``5400``, ``90m``, ``2h``, ``1h30m`` or ``1d``: a limit as a person writes it."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write seconds (5400) or numbers with units, "
                                         "larger first (90m, 2h, 1h30m, 1d)")
    seconds = sum(float(number) * unit for number, unit in zip(match.groups(), _UNIT_SECONDS) if number is not None)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration > 0")
    return seconds
