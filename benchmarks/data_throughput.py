"""Data-path throughput: torchvision's per-item PIL path vs gan_accel's in-memory uint8 path.

    python benchmarks/data_throughput.py --data-dir /work/shared/data

Prints two markdown tables: images/s of both paths (best of --rounds, the paths alternating so both see
the same machine load), and the time to fetch one batch as a share of a CPU DCGAN training step.
Timings only, no asserts. On a shared machine, load from other processes makes multi-threaded torch
ops on small tensors slow and noisy; ``--threads 1`` gives steadier numbers for the data paths.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from gan_accel.data import make_dataloader, resolve_dataset
from gan_accel.models import DCGANDiscriminator, DCGANGenerator


class PerItemPIL(Dataset):
    """What torchvision's MNIST does per item (uint8 -> PIL image -> transform), for non-MNIST data."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(Image.fromarray(self.images[i, 0].numpy(), mode="L")), int(self.labels[i])


def images_per_second(loader: Iterable, batches: int) -> tuple[float, float]:
    """(images/s, seconds per batch) over ``batches`` batches, starting a fresh epoch."""
    seen = 0
    start = time.perf_counter()
    for i, (x, _) in enumerate(loader):
        seen += x.shape[0]
        if i + 1 == batches:
            break
    elapsed = time.perf_counter() - start
    return seen / elapsed, elapsed / (i + 1)


def train_step_seconds(batch: torch.Tensor, steps: int) -> float:
    """Median seconds of one D + one G Adam update of DCGAN (width 64) with the non-saturating loss."""
    torch.manual_seed(0)
    G, D = DCGANGenerator(width=64), DCGANDiscriminator(width=64)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step() -> None:
        fake = G(torch.randn(batch.shape[0], G.z_dim))
        # D: log-loss on real (label 1) and fake (label 0), written with softplus on logits.
        d_loss = F.softplus(-D(batch)).mean() + F.softplus(D(fake.detach())).mean()
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()
        # G: non-saturating loss, -log D(G(z)).
        g_loss = F.softplus(-D(fake)).mean()
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()

    step()  # warm-up: allocator and kernel selection
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


LABELS = {
    "per-item": "torchvision per-item (PIL + ToTensor + Normalize), DataLoader",
    "fast": "gan_accel in-memory uint8, batched `__getitems__` + collate",
}


def measure_paths(info, data_dir: str, batch_size: int, batches: int, rounds: int,
                  train_steps: int) -> dict[str, Any]:
    """Both data paths over the same images, alternating for ``rounds`` rounds, and a DCGAN step.

    Returns ``{"per-item": [(images/s, s/batch) per round], "fast": [...], "batches": n, "step_s": s}``.
    """
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
    if info.name == "mnist":
        from torchvision.datasets import MNIST

        per_item_ds: Dataset = MNIST(data_dir, train=True, download=False, transform=tf)
    else:
        per_item_ds = PerItemPIL(info.images, info.labels, tf)
    per_item = DataLoader(per_item_ds, batch_size=batch_size, shuffle=True, num_workers=0)
    fast = make_dataloader(info.images, info.labels, batch_size, shuffle=True, num_workers=0)
    batches = min(batches, len(fast))
    results: dict[str, Any] = {"per-item": [], "fast": []}
    for _ in range(rounds):
        results["per-item"].append(images_per_second(per_item, batches))
        results["fast"].append(images_per_second(fast, batches))
    real, _ = next(iter(fast))
    results["batches"], results["step_s"] = batches, train_step_seconds(real, train_steps)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="data", help="folder holding MNIST/raw (default: ./data)")
    parser.add_argument("--dataset", default="auto", choices=["auto", "mnist", "digits"])
    parser.add_argument("--download", action="store_true", help="allow downloading MNIST if it is missing")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=100, help="batches timed per path and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best is reported")
    parser.add_argument("--train-steps", type=int, default=5, help="timed DCGAN steps (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    info = resolve_dataset(args.dataset, args.data_dir, download=args.download)
    bs = args.batch_size
    results = measure_paths(info, args.data_dir, bs, args.batches, args.rounds, args.train_steps)
    best = {name: max(results[name]) for name in LABELS}  # max images/s == min time per batch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(
        f"\ndataset: {info.name} ({len(info)} images, {info.source}); torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {load}; "
        f"batch {bs}, {results['batches']} batches x {args.rounds} rounds\n"
    )
    print("| data path | images/s (best) | images/s (median) | ms / batch |")
    print("|---|---:|---:|---:|")
    for name in LABELS:
        median = statistics.median(r[0] for r in results[name])
        print(f"| {LABELS[name]} | {best[name][0]:,.0f} | {median:,.0f} | {best[name][1] * 1e3:.3f} |")
    print(f"\nspeed-up of the fast path: {best['fast'][0] / best['per-item'][0]:.1f}x\n")

    step_s = results["step_s"]
    print(f"| data path | fetch ms / batch | CPU DCGAN step ms (batch {bs}) | data wait share of a step |")
    print("|---|---:|---:|---:|")
    for name in LABELS:
        fetch_s = best[name][1]
        share = fetch_s / (fetch_s + step_s)
        print(f"| {name} | {fetch_s * 1e3:.3f} | {step_s * 1e3:.1f} | {share:.2%} |")
    print(
        "\n(step = one D and one G Adam update, non-saturating loss, DCGAN width 64, 28x28; "
        "share = fetch / (fetch + step), i.e. without prefetching overlap)"
    )


if __name__ == "__main__":
    main()
