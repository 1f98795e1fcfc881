"""Your own networks, loss, phase and callback, without touching the engine.

    python examples/custom_modules.py                  # a few minutes on 2 CPU cores
    accelerate launch examples/custom_modules.py       # same flags, several processes

Everything specific to this model lives in this file:

* **networks**: a small residual generator and discriminator (not from gan_accel.models);
* **loss**: the relativistic average GAN (Jolicoeur-Martineau, 2018). Its generator loss needs D's
  logits on *real* images, which a loss of fake logits alone cannot express; a phase loss reads both
  through the step context;
* **an extra phase with an extra network**: an encoder E learns to map G's samples back to their
  latents (trained on detached samples, so it never changes G), giving an approximate inverse of G;
* **a callback**: every sample interval it writes ``interpolation_<step>.png``, G along straight
  lines between pairs of fixed latents, and logs how well E recovers latents.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gan_accel import Callback, GANTrainer, Phase, StepContext, TrainConfig, build_accelerator
from gan_accel.data import make_dataloader, resolve_dataset
from gan_accel.cli.aliases import TRAINING
from gan_accel.cli.arguments import ArgumentParser, nonnegative_int, positive_float, positive_int
from gan_accel.ending import run_script
from gan_accel.pictures import save_grid


# -- the networks -------------------------------------------------------------------------------------------
class ResBlock(nn.Module):
    def __init__(self, channels: int, norm: bool) -> None:
        super().__init__()
        layer = (lambda: nn.BatchNorm2d(channels)) if norm else (lambda: nn.Identity())
        self.body = nn.Sequential(layer(), nn.LeakyReLU(0.2), nn.Conv2d(channels, channels, 3, padding=1),
                                  layer(), nn.LeakyReLU(0.2), nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.body(x)


class ResGenerator(nn.Module):
    """z -> 7x7 residual stage (2w channels) -> 14x14 residual stage (w) -> 28x28 image in [-1, 1]."""

    def __init__(self, z_dim: int = 64, width: int = 32) -> None:
        super().__init__()
        self.width = width
        self.project = nn.Linear(z_dim, 2 * width * 7 * 7)
        self.blocks = nn.Sequential(ResBlock(2 * width, norm=True), nn.Upsample(scale_factor=2),
                                    nn.Conv2d(2 * width, width, 3, padding=1), ResBlock(width, norm=True),
                                    nn.Upsample(scale_factor=2))
        self.out = nn.Sequential(nn.BatchNorm2d(width), nn.LeakyReLU(0.2), nn.Conv2d(width, 1, 3, padding=1), nn.Tanh())

    def forward(self, z: Tensor) -> Tensor:
        return self.out(self.blocks(self.project(z).view(-1, 2 * self.width, 7, 7)))


class ResDiscriminator(nn.Module):
    """28x28 image -> 14x14 residual stage (w) -> 7x7 residual stage (2w) -> one logit. No BatchNorm."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.LeakyReLU(0.2), nn.AvgPool2d(2),
                                 ResBlock(width, norm=False), nn.Conv2d(width, 2 * width, 3, padding=1),
                                 nn.AvgPool2d(2), ResBlock(2 * width, norm=False), nn.LeakyReLU(0.2), nn.Flatten(),
                                 nn.Linear(2 * width * 7 * 7, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(1)


class Encoder(nn.Module):
    """Image -> latent: the extra network of the extra phase."""

    def __init__(self, z_dim: int = 64, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, width, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(width, width, 4, 2, 1),
                                 nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(width * 7 * 7, z_dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


# -- the loss: relativistic average GAN, as phase losses --------------------------------------------------
def ragan_d_loss(ctx: StepContext) -> Tensor:
    """D: real images should look more real than the average fake, and fakes less real than the average real."""
    real, fake = ctx.discriminate(ctx.real), ctx.discriminate(ctx.fake)  # ctx.fake is detached here
    ctx.log("D(x)", real.mean())
    ctx.log("D(G(z))", fake.mean())
    return F.softplus(-(real - fake.mean())).mean() + F.softplus(fake - real.mean()).mean()


def ragan_g_loss(ctx: StepContext) -> Tensor:
    """G: the mirror image, which also pushes real logits down (the generator sees real data too)."""
    real, fake = ctx.discriminate(ctx.real), ctx.discriminate(ctx.fake)
    return F.softplus(real - fake.mean()).mean() + F.softplus(-(fake - real.mean())).mean()


def encoder_loss(ctx: StepContext) -> Tensor:
    """E recovers the latents of G's (detached) samples."""
    return F.mse_loss(ctx.nets["E"](ctx.fake), ctx.latents)


PHASES = [
    Phase("D", "D", ragan_d_loss, new_data=True),
    Phase("G", "G", ragan_g_loss),
    Phase("E", "E", encoder_loss),  # reuses the window's latents; G's samples are detached for E
]


# -- the callback -----------------------------------------------------------------------------------------
class InterpolationStrip(Callback):
    """On every sample event: G along lines between pairs of fixed latents, and E's latent recovery error."""

    def __init__(self, pairs: int = 6, points: int = 8) -> None:
        self.pairs, self.points = pairs, points

    def on_sample(self, trainer: GANTrainer) -> None:
        if not trainer.accelerator.is_main_process:
            return
        start, end = trainer.fixed_latents[: self.pairs], trainer.fixed_latents[self.pairs: 2 * self.pairs]
        weights = torch.linspace(0, 1, self.points).view(1, -1, 1)
        lines = (start.unsqueeze(1) * (1 - weights) + end.unsqueeze(1) * weights).flatten(0, 1)
        images = trainer.generate(lines)
        save_grid(images, trainer.output_dir / f"interpolation_{trainer.step:06d}.png", nrow=self.points)
        E = trainer.accelerator.unwrap_model(trainer.networks["E"])
        with torch.no_grad():
            error = F.mse_loss(E(images.to(next(E.parameters()).device)).cpu(), lines).item()
        baseline = lines.pow(2).mean().item()  # the error of always guessing zero
        trainer.accelerator.print(f"step {trainer.step}: encoder latent error {error:.3f} "
                                  f"(guessing zero: {baseline:.3f})")


# -- the run ----------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.splitlines()[0],
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("GAN_ACCEL_DATA_DIR", "./data"))
    parser.add_argument("--dataset", choices=("auto", "mnist", "digits"), default="auto")
    parser.add_argument("--output-dir", default="runs/custom_modules")
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--steps", type=positive_int, default=1500)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--width", type=positive_int, default=16)
    parser.add_argument("--z-dim", type=positive_int, default=64)
    parser.add_argument("--lr", type=positive_float, default=5e-4, help="for G, D and E")
    parser.add_argument("--sample-every", type=positive_int, default=500)
    parser.add_argument("--log-every", type=positive_int, default=100)
    parser.add_argument("--resume", default=None, metavar="latest|auto|PATH")
    parser.add_argument("--no-progress", action="store_true")
    parser.read_aliases(TRAINING)  # --output_dir, --max_train_steps, --outdir, ... (docs/cli.md)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_script(lambda: train(args), debug=args.debug)


def train(args: argparse.Namespace) -> int:
    config = TrainConfig(max_steps=args.steps, batch_size=args.batch_size, z_dim=args.z_dim, lr_G=args.lr,
                         lr_D=args.lr, lr_schedule="constant", warmup_ratio=0.0, ema_decay=0.99,
                         sample_every=args.sample_every, log_every=args.log_every, output_dir=args.output_dir,
                         seed=args.seed, progress_bar=not args.no_progress)
    accelerator = build_accelerator(config)
    data = resolve_dataset(args.dataset, args.data_dir, accelerator=accelerator, log=accelerator.print)
    loader = make_dataloader(data.images, data.labels, args.batch_size)
    torch.manual_seed(args.seed)
    trainer = GANTrainer(ResGenerator(args.z_dim, args.width), ResDiscriminator(args.width), loader, config,
                         accelerator=accelerator, phases=PHASES,
                         extra_networks={"E": Encoder(args.z_dim, args.width)}, callbacks=[InterpolationStrip()])
    metrics = trainer.fit(resume_from=args.resume)
    accelerator.print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
