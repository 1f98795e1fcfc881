"""Train a class-conditional DCGAN on MNIST with gan_accel, and sample the digit you ask for.

    python examples/conditional_mnist.py --eval              # 4-7 minutes on 2 CPU cores
    accelerate launch examples/conditional_mnist.py          # same flags, as many processes as configured
    gan-accel sample runs/conditional_mnist --label 3 --num 100 --out threes.png

The flags are those of examples/dcgan_mnist.py (the two share their code), plus --spectral-norm,
--label-distribution, --class-weight and --d-position. G is G(z, y) (the label's embedding joined to
the latent), D is a projection discriminator D(x, y) with coordinate channels (so it sees where
strokes sit); the dataloader's labels reach D with their images. The progress grids have
one row per digit. With --eval, 1,000 samples of each digit are judged by an MNIST classifier:
eval.json holds the share assigned to the digit asked for, per digit, and the Frechet distance.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # dcgan_mnist.py, also when imported by tests

import dcgan_mnist  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return dcgan_mnist.main(argv, conditional=True)


if __name__ == "__main__":
    sys.exit(main())
