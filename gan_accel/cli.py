"""The ``gan-accel`` command: sample from or evaluate a trained run (DCGAN or conditional DCGAN).

    gan-accel sample runs/dcgan_mnist --num 64 --out grid.png
    gan-accel sample runs/conditional_mnist --label 3 --num 100 --out threes.png
    gan-accel sample runs/conditional_mnist/checkpoints/checkpoint_00002000 --format npz --out samples.npz
    gan-accel eval runs/dcgan_mnist --data-dir ./data

A run folder gives its final generator.safetensors; a checkpoint folder gives G as of that step
(its EMA when the run kept one). Training itself is ``python examples/dcgan_mnist.py`` (or
``accelerate launch`` of it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from .errors import CheckpointError
from .sampling import load_generator, sample_images
from .scripts import ArgumentParser, nonnegative_int, positive_int, run_script


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="gan-accel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    sample = commands.add_parser("sample", help="write a grid of samples from a run's generator")
    sample.add_argument("run_dir")
    sample.add_argument("--num", type=positive_int, default=64)
    sample.add_argument("--seed", type=nonnegative_int, default=0)
    sample.add_argument("--label", type=nonnegative_int, default=None,
                        help="a conditional run: sample this class (default: every class, one row each)")
    sample.add_argument("--format", choices=("png", "npz"), default="png",
                        help="png: a grid; npz: arrays 'images' (N, C, H, W) in [-1, 1] and 'labels'")
    sample.add_argument("--out", default=None, help="output path (default: <run_dir>/samples_cli.<format>)")
    evaluate = commands.add_parser(
        "eval", help="score a run or checkpoint: FD, KID, precision, recall and digit shares (MNIST classifier)")
    evaluate.add_argument("run_dir", help="a finished run folder or any of its checkpoints/checkpoint_<step>")
    evaluate.add_argument("--data-dir", default=os.environ.get("GAN_ACCEL_DATA_DIR", "./data"),
                          help="where MNIST is (env GAN_ACCEL_DATA_DIR)")
    evaluate.add_argument("--num", type=positive_int, default=10_000, help="samples to score")
    evaluate.add_argument("--out", default=None, help="also write the scores as JSON here (an existing file is kept)")
    args = parser.parse_args(argv)
    return run_script(lambda: _run(args), debug=args.debug)


def _run(args: argparse.Namespace) -> int:
    G, info = load_generator(args.run_dir)
    if args.command == "sample":
        return _sample(G, info, args)
    from .eval.mnist import evaluate_conditional_generator, evaluate_generator

    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        raise CheckpointError(f"{out} exists: choose another --out (nothing is overwritten)")
    fallback = _offline_digits(info)
    if info["conditional"]:
        result = evaluate_conditional_generator(G, args.data_dir, z_dim=G.z_dim, per_class=max(1, args.num // 10),
                                                fallback=fallback)
    else:
        result = evaluate_generator(G, args.data_dir, z_dim=G.z_dim, num_samples=args.num, fallback=fallback)
    print(result.pop("summary"))
    result.update(source=str(args.run_dir), step=info["step"])
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


def _offline_digits(info: dict):
    """The built-in digit set when the run trained on it (its scores are then against that set)."""
    if info["config"].get("extra", {}).get("dataset") in (None, "mnist"):
        return None
    from .data import resolve_dataset

    return resolve_dataset("digits", ".", log=None)


def _sample(G, info: dict, args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path(args.run_dir) / f"samples_cli.{args.format}"
    if out.exists() and not args.out:
        raise CheckpointError(f"{out} exists: pass --out to choose where the samples go (nothing is overwritten)")
    images, labels = sample_images(G, info, args.num, label=args.label, seed=args.seed)
    if args.format == "npz":
        arrays = {"images": images.float().numpy()}
        if labels is not None:
            arrays["labels"] = labels.numpy()
        np.savez(out, **arrays)
    else:
        from .visuals import save_grid

        # a conditional run: one row per class, or one class in rows of 10; otherwise a square grid
        if not info["conditional"]:
            columns = None
        else:
            columns = len(images) // info["num_classes"] if args.label is None else min(10, len(images))
        save_grid(images, out, nrow=columns)
    what = f"class {args.label}" if args.label is not None else "every class" if info["conditional"] else "samples"
    print(f"wrote {out} ({len(images)} samples, {what}, step {info['step']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
