"""The ``gan-accel`` command: train on your own images; sample, evaluate, describe, plot and export a run.

    gan-accel train --data photos/ --resolution 64 --output-dir runs/photos
    gan-accel sample runs/dcgan_mnist --num 64 --out grid.png
    gan-accel sample runs/dcgan_mnist --num 10000 --format folder --out fid_samples
    gan-accel sample runs/conditional_mnist --label 3 --num 100 --out threes.png
    gan-accel sample runs/conditional_mnist/checkpoints/checkpoint_00002000 --no-ema --out raw.npz
    gan-accel sample runs/dcgan_mnist --seeds 0-35,40 --trunc 0.7 --out seeds   # seed0000.png ... seed0040.png
    gan-accel eval runs/dcgan_mnist --data-dir ./data
    gan-accel info runs/dcgan_mnist [--json]
    gan-accel plot runs/dcgan_mnist
    gan-accel export runs/photos photos_gan [--push-to-hub user/photos-gan]

A run folder gives its final generator/; a checkpoint folder gives G as of that step
(its EMA when the run kept one; --no-ema: the raw G). Every mistake is one ``error:`` line naming
the problem and the fix (exit code 2); nothing existing is ever replaced, and a run folder gets no file
from a command but ``train`` (its run folder), ``plot`` without --out, and a new --out or DIR you name there
(never under a name the run writes). Training
under several processes: ``accelerate launch -m gan_accel.cli train ...``. Every long option also
takes ``_`` for ``-``, and diffusers' and NVlabs' names for the same settings are read too
(``--output_dir``, ``--max_train_steps``, ``--kimg``, ``--outdir``: the table in docs/cli.md).
"""

from __future__ import annotations

import argparse
import sys

from ..ending import run_script
from .arguments import ArgumentParser
from . import evaluate, export, info, plot, sample, train

COMMANDS = (train, sample, evaluate, info, plot, export)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="gan-accel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser, metavar="COMMAND",
                                     title="commands (gan-accel COMMAND --help for each)")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    # --debug before the command is the main parser's; the command's own default would hide it
    return run_script(lambda: args.run(args), debug=args.debug or "--debug" in argv)


if __name__ == "__main__":
    sys.exit(main())
