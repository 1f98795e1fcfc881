"""`gan-accel train` with the DCGAN D changed in this process only, for the memorising-D measurements of
docs/models-and-augmentation.md (these variants are not options of gan_accel):

    python benchmarks/d_variants_train.py VARIANT train --data FOLDER --output-dir RUN --seed 0 --max-time 1800s

VARIANT: ``none`` (D unchanged), ``dropout`` (dropout 0.5 before D's last layer), ``noise`` (Gaussian noise of
sigma 0.1 on D's inputs while training: instance noise) or ``halfd`` (D of half the width). Score the runs with
``benchmarks/real_folders.py --config NAME=`` (an existing run is scored, not trained again).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import gan_accel.models.dcgan as dcgan

VARIANTS = ("none", "dropout", "noise", "halfd")


def patch(variant: str) -> None:
    init, forward = dcgan.DCGANDiscriminator.__init__, dcgan.DCGANDiscriminator.forward

    def patched_init(self, width=64, *args, **kwargs):
        init(self, width // 2 if variant == "halfd" else width, *args, **kwargs)
        if variant == "dropout":
            layers = list(self.net)
            self.net = nn.Sequential(*layers[:-1], nn.Dropout(0.5), layers[-1])

    def patched_forward(self, x):
        if variant == "noise" and self.training:
            x = x + 0.1 * torch.randn_like(x)
        return forward(self, x)

    dcgan.DCGANDiscriminator.__init__, dcgan.DCGANDiscriminator.forward = patched_init, patched_forward


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in VARIANTS:
        sys.exit(f"usage: d_variants_train.py {{{','.join(VARIANTS)}}} train ARGS... (see the docstring)")
    patch(sys.argv.pop(1))
    from gan_accel.cli import main

    sys.exit(main(sys.argv[1:]))
