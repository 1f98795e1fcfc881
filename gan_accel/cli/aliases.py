"""The flags users type by habit: ``_`` read as ``-`` in every long option, and the option names of diffusers'
training scripts and of NVlabs' StyleGAN scripts read as gan_accel's own.

The aliases are hidden from ``--help`` (30 extra lines would bury the real flags) and listed once, in the table
of docs/cli.md (:data:`TRAINING`, :data:`SAMPLING`; a test keeps the two in step). An alias is registered only
where its gan_accel flag exists, so a script without ``--num-workers`` refuses ``--workers`` as argparse does any
unknown flag. A value that cannot be mapped is one ``error:`` line naming the values that can.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .arguments import positive_float, positive_int


@dataclass(frozen=True)
class Alias:
    """``name`` (another tool's flag, ``_`` already read as ``-``) sets gan_accel's ``targets``; ``convert`` maps
    its value where the two tools count differently (None: the same value, parsed as the target parses it)."""

    name: str
    targets: tuple[str, ...]
    tool: str  # whose flag it is: "diffusers" or "NVlabs"
    meaning: str  # for docs/cli.md's table
    convert: Callable[[str], Any] | None = None
    nargs: str | None = None


def thousands_of_images(text: str) -> int:
    """NVlabs' ``--kimg``: the run's length in thousands of real images -> images (``--images``)."""
    return max(1, round(positive_float(text) * 1000))


thousands_of_images.__name__ = "a number of thousands of images > 0"  # argparse names the type in its messages

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switch(text: str) -> bool:
    """NVlabs' booleans (``--mirror=1``, ``--mirror=true``); the flag alone is on."""
    if text.strip().lower() in TRUE:
        return True
    if text.strip().lower() in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not on or off: write 1 or 0 (true or false)")


def trackers(text: str) -> list[str]:
    """diffusers' ``--report_to``: one tracker, several comma-separated, ``all``, or ``none`` (no tracker)."""
    from ..tracking import tracker_choices

    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["none"]:
        return []
    known = tracker_choices()
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{(unknown or [text])[0]!r} is not a tracker gan_accel logs to: name one of "
                                         f"{', '.join(known)}, or none")
    return names


def checkpoint_or_auto(text: str) -> str:
    """diffusers' ``--resume_from_checkpoint latest`` starts a new run when there is no checkpoint yet: ours is
    ``--resume auto``; a path stays a path."""
    return "auto" if text == "latest" else text


# gan_accel train and the example scripts (what add_run_flags gives them)
TRAINING: tuple[Alias, ...] = (
    Alias("--train-batch-size", ("--batch-size",), "diffusers", "images per process per micro-batch"),
    Alias("--gradient-accumulation-steps", ("--grad-accum",), "diffusers", "micro-batches per optimizer step"),
    Alias("--max-train-steps", ("--steps",), "diffusers", "optimizer steps of G"),
    Alias("--resume-from-checkpoint", ("--resume",), "diffusers",
          "a checkpoint folder; `latest` is `--resume auto` (diffusers starts a new run when there is none)",
          checkpoint_or_auto),
    Alias("--checkpointing-steps", ("--checkpoint-every",), "diffusers", "checkpoint every N steps"),
    Alias("--checkpoints-total-limit", ("--keep-checkpoints",), "diffusers", "how many recent checkpoints to keep"),
    Alias("--report-to", ("--log-with",), "diffusers", "the trackers (comma-separated, `all`, or `none`)", trackers),
    Alias("--dataloader-num-workers", ("--num-workers",), "diffusers", "data loading worker processes"),
    Alias("--outdir", ("--output-dir",), "NVlabs", "the run folder itself (NVlabs makes a numbered folder inside it)"),
    Alias("--kimg", ("--images",), "NVlabs", "the run's length in thousands of real images (all processes), "
          "in steps of the batch", thousands_of_images),
    Alias("--mirror", ("--random-flip",), "NVlabs", "`--mirror`, `--mirror=1`: mirror images left-right at random; "
          "`--mirror=0`: not", switch, "?"),
    Alias("--snap", ("--checkpoint-every", "--sample-every"), "NVlabs",
          "a checkpoint and a sample grid every N steps (NVlabs: every N ticks of 4,000 images)", positive_int),
    Alias("--workers", ("--num-workers",), "NVlabs", "data loading worker processes"),
)

# gan-accel sample
SAMPLING: tuple[Alias, ...] = (
    Alias("--outdir", ("--out",), "NVlabs", "the new folder of one PNG per seed (with `--seeds`)"),
)

# Flags both tools spell as gan_accel does once `_` is read as `-` (listed in docs/cli.md's table too).
SAME_NAME = {"--output_dir": "diffusers", "--mixed_precision": "diffusers", "--seed": "diffusers, NVlabs",
             "--data": "NVlabs", "--seeds": "NVlabs", "--trunc": "NVlabs"}


def normalise(tokens: Sequence[str], known: Callable[[str], bool]) -> list[str]:
    """``tokens`` with ``_`` read as ``-`` in every long option's name (``--output_dir``, ``--x_y=v``), up to a bare
    ``--``; a name the parser ``known`` as written (a script's own ``--my_flag``) is left as it is."""
    out = list(tokens)
    for index, token in enumerate(out):
        if token == "--":
            break
        name, equals, value = token.partition("=")
        if name.startswith("--") and "_" in name and not known(name):
            out[index] = name.replace("_", "-") + equals + value
    return out


def register(parser: argparse.ArgumentParser, aliases: Sequence[Alias]) -> set[str]:
    """Add each alias whose gan_accel flags ``parser`` has, hidden from ``--help``. An alias with the same value
    is the target's own action under another name (argparse then checks and reports it as that flag); one that
    converts is an action of its own beside the target, in the target's exclusive group (``--kimg`` and
    ``--steps`` cannot both be given). Returns the names added."""
    actions = parser._option_string_actions  # argparse keeps one name -> action table per parser
    added = set()
    for alias in aliases:
        targets = [actions.get(flag) for flag in alias.targets]
        if alias.name in actions or not all(targets):  # the script's own flag of that name wins
            continue
        added.add(alias.name)
        if alias.convert is None:
            actions[alias.name] = targets[0]
            continue
        group = next((g for g in parser._mutually_exclusive_groups if targets[0] in g._group_actions), None)
        action = (group or parser).add_argument(
            alias.name, action=SetTargets, dests=[t.dest for t in targets], type=alias.convert, nargs=alias.nargs,
            const=True if alias.nargs == "?" else None, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if group is not None:  # beside the group's others: argparse draws "[--steps | --epochs]" for neighbours only
            parser._actions.remove(action)
            parser._actions.insert(parser._actions.index(group._group_actions[-2]) + 1, action)
    return added


class SetTargets(argparse.Action):
    """Sets every target flag's value to the alias's converted value (``--snap``: two of them)."""

    def __init__(self, option_strings: list[str], dest: str, dests: list[str], **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.dests = dests

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        for dest in self.dests:
            setattr(namespace, dest, values)
