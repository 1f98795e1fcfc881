"""One training configuration of the MNIST DCGAN, scored with the MNIST classifier (for ablations).

    python benchmarks/ablation.py --name lr1e-3 --width 32 --batch 64 --steps 5000 --lr 1e-3 --ema 0.99

Trains in-process with GANTrainer on real MNIST, then prints (and appends to --results) the Frechet
distance in classifier-feature space of 10k samples from the raw G and from its EMA, each with
BatchNorm in eval and in train mode, plus the smallest share of any predicted digit.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import time

import torch

from gan_accel import GANTrainer, TrainConfig
from gan_accel.data import load_mnist_uint8, make_dataloader
from gan_accel.eval.mnist import evaluate_generator
from gan_accel.models import DCGANDiscriminator, DCGANGenerator


class TrainModeG(torch.nn.Module):
    """Samples with BatchNorm using batch statistics (as pytorch/examples does)."""

    def __init__(self, G: torch.nn.Module) -> None:
        super().__init__()
        self.G = G

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        self.G.train()
        return self.G(z)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="run")
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.99, help="0 disables")
    p.add_argument("--schedule", default="constant")
    p.add_argument("--warmup", type=float, default=0.05)
    p.add_argument("--loss", default="nonsaturating")
    p.add_argument("--results", default="runs/ablation.jsonl")
    a = p.parse_args()

    images, labels = load_mnist_uint8(a.data_dir, download=False)
    torch.manual_seed(0)
    G, D = DCGANGenerator(width=a.width), DCGANDiscriminator(width=a.width)
    config = TrainConfig(max_steps=a.steps, batch_size=a.batch, lr_G=a.lr, lr_D=a.lr, ema_decay=a.ema or None,
                         lr_schedule=a.schedule, warmup_ratio=a.warmup, loss=a.loss, sample_every=10**6,
                         log_every=100, checkpoint_every=10**6, output_dir=f"runs/ablation/{a.name}",
                         progress_bar=False)
    shutil.rmtree(config.output_dir, ignore_errors=True)  # this benchmark's own folder: each run starts afresh
    start = time.perf_counter()
    trainer = GANTrainer(G, D, make_dataloader(images, labels, a.batch), config)
    trainer.fit()
    result = {"name": a.name, "seconds": round(time.perf_counter() - start), **vars(a)}
    raw = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.G))
    variants = [("raw_eval", raw), ("raw_train", TrainModeG(copy.deepcopy(raw)))]
    if trainer.ema is not None:
        variants += [("ema_eval", trainer.ema.module), ("ema_train", TrainModeG(copy.deepcopy(trainer.ema.module)))]
    for label, model in variants:
        scores = evaluate_generator(model, a.data_dir, z_dim=100)
        result[label] = round(scores["fd"], 2)
        result[f"{label}_min_class_share"] = round(scores["min_class_share"], 3)
    print(json.dumps(result), flush=True)
    with open(a.results, "a") as handle:
        handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
