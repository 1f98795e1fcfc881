"""The command line's argument parser and number types, shared by ``gan-accel`` and the example scripts.

A bad flag is one ``error:`` line, exit 2 (``--epochs 0`` is refused by the parser, not by a traceback
later); :func:`gan_accel.ending.run_script` does the same for every other expected failure. Every long option
takes ``_`` for ``-``, and a parser may read other tools' names for its flags (:mod:`gan_accel.cli.aliases`).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Callable, NoReturn, Sequence

from ..config import MAX_SEED
from ..processes import is_first_process


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one ``error:`` line (exit 2), that has ``--debug``, reads ``_`` as ``-``
    in long options and the aliases given to :meth:`read_aliases`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", help="show the full traceback of any error")
        self.aliases: list[Any] = []  # gan_accel.cli.aliases.Alias, registered at the first parse
        self.alias_names: set[str] | None = None  # the names registered, once they are
        self.remember_given = False  # remember_given_flags(): the parse also records which options were given

    def read_aliases(self, aliases: Sequence[Any]) -> None:
        """Also read these other tools' names for flags (registered once every flag is added, at the first parse)."""
        self.aliases.extend(aliases)

    def options(self) -> dict[str, argparse.Action]:
        """Every option name this parser reads, aliases included, with its action."""
        from .aliases import register

        if self.alias_names is None:
            self.alias_names = register(self, self.aliases)
        return dict(self._option_string_actions)

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        # argparse's matching of abbreviations (--check for --checkpoint-every): gan_accel's own flags only, so an
        # alias is read when written in full and never makes an abbreviation that worked before ambiguous
        return [match for match in super()._get_option_tuples(option_string) if match[1] not in self.options_added()]

    def options_added(self) -> set[str]:
        """The aliases registered (none before the first parse)."""
        return self.alias_names or set()

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        from .aliases import normalise

        self.options()  # the aliases, registered once every flag is added
        tokens = normalise(sys.argv[1:] if args is None else list(args), lambda name: name in self._option_string_actions)
        parsed, extras = super().parse_known_args(tokens, namespace)
        if self.remember_given:
            parsed.flags_given = self.given(tokens)
            parsed.option_names = {action.dest: action.option_strings[0] for action in self._actions
                                   if action.option_strings and action.option_strings[0] not in self.options_added()}
        return parsed, extras

    def remember_given_flags(self) -> None:
        """Record, as ``flags_given`` in the parsed namespace, the destinations of the options given: a setting
        a user typed shows as theirs even where its value is the default's (``--seed 0``); and, as
        ``option_names``, each destination's flag (``lr_g``: ``--lr-g``)."""
        self.remember_given = True

    def given(self, tokens: Sequence[str]) -> frozenset[str]:
        """The destinations ``tokens`` set: the same parse with every default left out (``tokens`` already parsed
        once, so this one cannot fail)."""
        saved = [(action, action.default) for action in self._actions]
        defaults, self._defaults = self._defaults, {}
        try:
            for action in self._actions:
                action.default = argparse.SUPPRESS
            seen, _ = super().parse_known_args(list(tokens), argparse.Namespace())
        finally:
            for action, default in saved:
                action.default = default
            self._defaults = defaults
        return frozenset(vars(seen))

    def error(self, message: str) -> NoReturn:
        if is_first_process():
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


MAX_SEEDS = 10_000_000  # gan-accel sample --seeds: one image each, at most as many as --num allows


def seed_ranges(text: str) -> list[int]:
    """NVlabs' seed lists: ``0-35,40`` -> 0, 1, ..., 35, 40 (ranges inclusive, in the order written, a seed listed
    twice kept once); each a seed numpy and torch accept, at most :data:`MAX_SEEDS` in all."""
    seeds: dict[int, None] = {}  # ordered, without repeats
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list of seeds: write 0-35,40 (ranges include both "
                                             "ends)")
        low, high = int(match[1]), int(match[2] or match[1])
        if high < low:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} counts down: write the smaller seed first "
                                             f"({high}-{low})")
        if high > MAX_SEED:
            raise argparse.ArgumentTypeError(f"seed {high:,} is more than {MAX_SEED:,}, the largest numpy and torch "
                                             "both accept")
        if len(seeds) + high - low + 1 > MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"{text!r} lists more than {MAX_SEEDS:,} seeds: ask for fewer at a time")
        seeds.update(dict.fromkeys(range(low, high + 1)))
    return list(seeds)


seed_ranges.__name__ = "a list of seeds"


def finite_float(text: str) -> float:
    """Any finite number (``--trunc``: psi below 0 or above 1 is unusual, not wrong)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value
