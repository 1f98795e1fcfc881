"""The ``gan-accel`` command: sample from or evaluate a trained DCGAN run.

    gan-accel sample runs/dcgan_mnist --num 64 --out grid.png
    gan-accel eval runs/dcgan_mnist --data-dir ./data

Training itself is ``python examples/dcgan_mnist.py`` (or ``accelerate launch`` of it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from .errors import CheckpointError
from .models import DCGANGenerator
from .scripts import ArgumentParser, nonnegative_int, positive_int, run_script
from .state.weights import load_weights, read_metadata


def load_run_generator(run_dir: str | Path) -> tuple[DCGANGenerator, dict]:
    """The generator saved in ``run_dir/generator.safetensors``, rebuilt from the config in its metadata."""
    path = Path(run_dir) / "generator.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{path} not found: is {run_dir} a finished gan_accel run folder? (the weights are "
                              "written at the end of a run)")
    metadata = read_metadata(path)
    model = metadata.get("config", {}).get("extra", {}).get("model")
    if not model or not {"z_dim", "width", "image_size", "channels"} <= set(model):
        raise CheckpointError(f"{path} does not record DCGAN model sizes (config.extra.model): load it with "
                              "gan_accel.state.load_weights and your own generator class")
    G = DCGANGenerator(z_dim=model["z_dim"], width=model["width"], image_size=model["image_size"],
                       channels=model["channels"])
    return load_weights(G, path).eval(), metadata


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="gan-accel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    sample = commands.add_parser("sample", help="write a grid of samples from a run's generator")
    sample.add_argument("run_dir")
    sample.add_argument("--num", type=positive_int, default=64)
    sample.add_argument("--seed", type=nonnegative_int, default=0)
    sample.add_argument("--out", default=None, help="PNG path (default: <run_dir>/samples_cli.png)")
    evaluate = commands.add_parser("eval", help="score 10k samples with the MNIST classifier")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--data-dir", default="./data")
    evaluate.add_argument("--num", type=positive_int, default=10_000)
    args = parser.parse_args(argv)
    return run_script(lambda: _run(args), debug=args.debug)


def _run(args: argparse.Namespace) -> int:
    G, metadata = load_run_generator(args.run_dir)
    if args.command == "sample":
        from .visuals import save_grid

        out = Path(args.out) if args.out else Path(args.run_dir) / "samples_cli.png"
        if out.exists() and not args.out:
            raise CheckpointError(f"{out} exists: pass --out to choose where the grid goes (nothing is overwritten)")
        noise = torch.randn(args.num, G.z_dim, generator=torch.Generator().manual_seed(args.seed))
        with torch.no_grad():
            images = G(noise)
        save_grid(images, out)
        print(f"wrote {out} ({args.num} samples, step {metadata.get('step')})")
        return 0
    from .eval.mnist import evaluate_generator

    result = evaluate_generator(G, args.data_dir, z_dim=G.z_dim, num_samples=args.num)
    print(result.pop("summary"))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
