"""``gan-accel export RUN_OR_CHECKPOINT DIR``: the run's generator as a folder Hugging Face users recognise.

    gan-accel export runs/photos photos_gan
    gan-accel export runs/photos photos_gan --license cc-by-4.0 --push-to-hub user/photos-gan

DIR gets the run's ``generator/`` folder, ``config.json`` (everything needed to rebuild G) and
``model.safetensors`` (the EMA of G when the run kept one; ``--no-ema``: the raw G), plus ``README.md`` (the model card: samples, data, scores, training
settings, usage) and ``samples.png``. ``gan_accel.load_generator(DIR)`` rebuilds G from it without
training code. DIR must not exist: it is written beside its final name and renamed into place when
complete. ``--push-to-hub REPO`` then creates the model repo (if new) and uploads the folder (needs a
token with write access: ``--token``, ``$HF_TOKEN`` or ``hf auth login``; the token is never printed).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..text import printable
from .arguments import nonnegative_int, positive_int
from .common import check_new_output, resolve_source


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "export", help="write a run's generator as a Hugging Face style folder (config, safetensors, model card); "
                       "optionally push it to the Hub", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a finished run folder (its generator/) or a checkpoints/checkpoint_<step> folder")
    parser.add_argument("dir", metavar="DIR", help="the new folder to write (it must not exist)")
    parser.add_argument("--no-ema", action="store_true", help="export the raw G instead of its EMA")
    parser.add_argument("--num", type=positive_int, default=64,
                        help="samples in the card's grid (default 64; a conditional G: 8 per class, 16 classes at most)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="the grid's latents' seed (default 0)")
    parser.add_argument("--license", default=None,
                        help="the model card's license id (e.g. apache-2.0, cc-by-4.0; default: none stated: the "
                             "data's terms decide)")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO",
                        help="then upload DIR to this Hugging Face model repo (user/name), creating it if new")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    parser.add_argument("--token", default=None,
                        help="with --push-to-hub: a token with write access (default: $HF_TOKEN or hf auth login's)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..hub import export_generator, push_to_hub
    from ..hub.load import read_export_config

    source = resolve_source(args.source)
    out = Path(args.dir)
    check_new_output(out, flag="DIR")
    export_generator(source, out, ema=not args.no_ema, num_samples=args.num, seed=args.seed,
                     license=args.license, repo_id=args.push_to_hub)
    weights = read_export_config(out)["weights"]
    print(f"wrote {out}: config.json, model.safetensors ({'the EMA of G' if weights['ema'] else 'the raw G'} of step "
          f"{printable(str(weights['step']))}), README.md (the model card) and samples.png; load it with "
          f"gan_accel.load_generator({str(out)!r})")
    if args.push_to_hub:
        url = push_to_hub(out, args.push_to_hub, private=args.private, token=args.token)
        print(f"pushed {out} to {url}")
    return 0
