"""What the engine costs: GANTrainer against a hand-written loop, side by side in one process.

Same models, same in-memory data (one uint8 tensor, gan_accel's batched loader), same batch, same Adam
optimizers, same loss; the hand-written loop is the pytorch/examples DCGAN step (one G forward, D on
real and detached fakes, then G through D). The two are stepped *alternately* in one run (a plain
step after every engine step), so both see the same machine conditions step by step: on a shared
2-core machine, speeds drift by 15% between runs seconds apart. The table gives median images/s
over the steps, and the median over repeats of the ratio engine / plain. The engine runs with its
defaults (divergence guard, metrics, schedulers) but without writing files (samples, checkpoints).

``--control`` runs the protocol with the plain loop on both sides (two copies, alternating): the
ratio it prints is what the protocol reads when there is no difference, so an engine / plain ratio
outside that spread is the engine's, not the order of the steps or the machine's.

``--keep-freed-memory`` first makes glibc keep freed memory in this process (what
``TrainConfig(keep_freed_memory=True)`` does; process-wide, so both sides run with it).

    python benchmarks/engine_overhead.py [--repeats 3] [--steps 200] [--control] [--keep-freed-memory]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gan_accel import Callback, GANTrainer, TrainConfig  # noqa: E402
from gan_accel.data import make_dataloader  # noqa: E402
from gan_accel.engine.speed import keep_freed_memory  # noqa: E402
from gan_accel.models import DCGANDiscriminator, DCGANGenerator, MLPDiscriminator, MLPGenerator  # noqa: E402

QUIET = ("sample_saver", "training_plot", "checkpointer", "weights_exporter", "progress_bar", "signal_handler")


def dcgan(width: int):
    def build():
        torch.manual_seed(0)
        return DCGANGenerator(z_dim=100, width=width, image_size=28), DCGANDiscriminator(width=width, image_size=28), 100
    return build


def mlp():
    torch.manual_seed(0)
    return MLPGenerator(z_dim=2, hidden=128, depth=3), MLPDiscriminator(hidden=128, depth=3), 2


def data_for(kind: str, n: int = 8192) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind == "mlp":
        return torch.randn(n, 2, generator=g)
    return torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)


def loader_for(data: torch.Tensor, batch: int):
    if data.dtype == torch.uint8:
        return make_dataloader(data, torch.zeros(len(data), dtype=torch.long), batch, shuffle=True, drop_last=True,
                               generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=batch, shuffle=True,
                                       drop_last=True, generator=torch.Generator().manual_seed(0))


class PlainLoop:
    """The hand-written loop, one step per call (pytorch/examples' DCGAN step)."""

    def __init__(self, build, data: torch.Tensor, batch: int) -> None:
        self.G, self.D, self.z_dim = build()
        # fused, as the engine builds its default optimizers: the same optimizers on both sides
        self.opt_G = torch.optim.Adam(self.G.parameters(), lr=2e-4, betas=(0.5, 0.999), fused=True)
        self.opt_D = torch.optim.Adam(self.D.parameters(), lr=2e-4, betas=(0.5, 0.999), fused=True)
        self.batch = batch
        loader = loader_for(data, batch)
        self.stream = (b for _ in iter(int, 1) for b in loader)

    def step(self) -> None:
        G, D = self.G, self.D
        real = next(self.stream)[0]
        fake = G(torch.randn(self.batch, self.z_dim))
        loss_D = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
        self.opt_D.zero_grad(set_to_none=True)
        loss_D.backward()
        self.opt_D.step()
        for p in D.parameters():
            p.requires_grad_(False)
        loss_G = F.softplus(-D(fake)).mean()
        self.opt_G.zero_grad(set_to_none=True)
        loss_G.backward()
        self.opt_G.step()
        for p in D.parameters():
            p.requires_grad_(True)


class Lockstep(Callback):
    """After every engine step, one plain step: both are timed under the same machine conditions.

    Engine step time = time between two ``on_step_end`` calls minus the plain step run in between.
    """

    def __init__(self, plain: PlainLoop, warmup: int) -> None:
        self.plain, self.warmup = plain, warmup
        self.engine_times: list[float] = []
        self.plain_times: list[float] = []
        self.mark: float | None = None

    def on_step_end(self, trainer) -> None:
        now = time.perf_counter()
        if self.mark is not None and trainer.step > self.warmup:
            self.engine_times.append(now - self.mark)
        start = time.perf_counter()
        self.plain.step()
        end = time.perf_counter()
        if trainer.step > self.warmup:
            self.plain_times.append(end - start)
        self.mark = time.perf_counter()


def quiet_trainer(build, data: torch.Tensor, batch: int, max_steps: int, output_dir: str, callbacks=(),
                  **overrides) -> GANTrainer:
    """The engine as the benchmarks run it: defaults (guard, metrics, schedulers) but no files written,
    constant learning rate; ``overrides`` are TrainConfig fields (mixed_precision, channels_last, ...)."""
    G, D, z_dim = build()
    config = TrainConfig(max_steps=max_steps, batch_size=batch, z_dim=z_dim, lr_schedule="constant",
                         warmup_ratio=0.0, log_every=50, sample_every=10**9, checkpoint_every=10**9,
                         output_dir=output_dir, progress_bar=False, **overrides)
    return GANTrainer(G, D, loader_for(data, batch), config, callbacks=list(callbacks), disable_callbacks=QUIET)


def measure(build, data, batch: int, steps: int, warmup: int, **overrides) -> tuple[float, float]:
    """Median images/s of (plain loop, engine), stepped alternately in one run."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    lockstep = Lockstep(PlainLoop(build, data, batch), warmup)
    with tempfile.TemporaryDirectory() as tmp:
        quiet_trainer(build, data, batch, warmup + steps, tmp, [lockstep], **overrides).fit()
    return batch / statistics.median(lockstep.plain_times), batch / statistics.median(lockstep.engine_times)


CASES = {
    "DCGAN width 32, batch 64": (dcgan(32), "image", 64),
    "DCGAN width 64, batch 64": (dcgan(64), "image", 64),
    "MLP GAN (3x128), batch 256": (mlp, "mlp", 256),
}


def compare(case: str, repeats: int, steps: int, warmup: int) -> tuple[float, float, float]:
    """Medians over ``repeats`` lockstep runs of one case: plain images/s, engine images/s, engine / plain."""
    build, kind, batch = CASES[case]
    data = data_for(kind)
    plain, engine = zip(*(measure(build, data, batch, steps, warmup) for _ in range(repeats)))
    ratios = [e / p for e, p in zip(engine, plain)]
    return statistics.median(plain), statistics.median(engine), statistics.median(ratios)


def control(case: str, repeats: int, steps: int, warmup: int) -> tuple[float, float, float]:
    """The protocol's null reading: medians over ``repeats`` of (copy A images/s, copy B, B / A), two
    copies of the plain loop stepped alternately (A, then B) as the engine and the plain loop are."""
    build, kind, batch = CASES[case]
    data = data_for(kind)
    results = []
    for _ in range(repeats):
        first, second = PlainLoop(build, data, batch), PlainLoop(build, data, batch)
        times: tuple[list[float], list[float]] = ([], [])
        for index in range(warmup + steps):
            for loop, kept in ((first, times[0]), (second, times[1])):
                start = time.perf_counter()
                loop.step()
                if index >= warmup:
                    kept.append(time.perf_counter() - start)
        a, b = (batch / statistics.median(t) for t in times)
        results.append((a, b, b / a))
    return tuple(statistics.median(column) for column in zip(*results))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--control", action="store_true", help="the plain loop against itself (the protocol's null)")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="glibc keeps freed memory in this process, for both sides (TrainConfig.keep_freed_memory)")
    args = parser.parse_args(argv)
    kept = args.keep_freed_memory and keep_freed_memory(TrainConfig(keep_freed_memory=True), print)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
          f"{torch.get_num_threads()} threads; {args.repeats} repeats of {args.steps} steps, medians"
          f"{'; glibc keeps freed memory (keep_freed_memory)' if kept else ''}\n")
    measured, columns = (control, "plain loop A, images/s | plain loop B, images/s | B / A") if args.control else (
        compare, "plain loop, images/s | engine, images/s | engine / plain")
    print(f"| case | {columns} |")
    print("| --- | ---: | ---: | ---: |")
    for name in args.cases:
        plain, engine, ratio = measured(name, args.repeats, args.steps, args.warmup)
        print(f"| {name} | {plain:,.0f} | {engine:,.0f} | {ratio:.3f} |", flush=True)


if __name__ == "__main__":
    main()
