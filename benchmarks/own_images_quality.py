"""Quality of `gan-accel train` on a folder of RGB images with known classes, in a feature space stated here.

    python benchmarks/own_images_quality.py --out runs/bench_own --size 32 --seeds 0 1 \
        --config "dcgan=" --config "dcgan-cond=--conditional"
    python benchmarks/own_images_quality.py --out runs/bench_own --size 32 --seconds 600 \
        --config "dcgan=--model dcgan" --config "resnet=--model resnet"      # the same wall time each
    python benchmarks/own_images_quality.py --out runs/bench_small --size 32 --train-images 500 \
        --config "none=--augment none" --config "diffaugment=--augment diffaugment" --config "ada=--augment ada"

The data: ``benchmarks/make_rgb_digits.py`` draws MNIST digits in colour on coloured backgrounds, saved
as PNG files in class folders ``0/``-``9/``; the training set (``--train-images``, seed 0) and the
judge's set (10,000 other images, seed 1: other digits, inks and backgrounds) are built once.

The feature space: a small CNN classifier (the "judge": three conv blocks of 32, 64 and 64 channels with
batch norm, a 128-unit layer, 10 logits, used in eval mode) trained on the judge's set to tell the digit, whatever its colours. Its
accuracy on held-out images is printed. Each run's generator (its EMA when kept) draws 5,000 samples
(a conditional run: 500 of each class); they are scored against 5,000 held-out real images in the
judge's 128-d features: the Frechet distance (FD, lower is better), KID, precision and recall (k = 3),
and the class coverage read from the judge's predictions: the smallest class share and the number of
classes holding at least 5 % of the samples (10 of 10: every class is drawn). A conditional run also
reports how often a sample is read as the class it was asked for.

Each configuration (``--config NAME=FLAGS``, flags of ``gan-accel train``) trains once per seed in a
process of its own; its wall time is the training command's, and images/s the median of its metrics
rows. With ``--seconds`` each configuration first runs 40 steps to measure its speed and then trains for
as many steps as fit in that many seconds, so different models are compared at the same wall time.
Results: a Markdown table on stdout and ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
JUDGE_IMAGES, HELD_OUT, SAMPLES = 10_000, 5_000, 5_000


class Judge(nn.Module):
    """A compact classifier of 3-channel images in [-1, 1]; ``features`` are its 128-d penultimate layer."""

    def __init__(self, size: int, channels: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(4))
        self.fc = nn.Linear(64 * 16, 128)
        self.head = nn.Linear(128, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(self.conv(x).flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_set(folder: Path, num: int, size: int, seed: int) -> None:
    if (folder / "9").is_dir():
        return
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_rgb_digits.py"), "--out", str(folder),
                    "--num", str(num), "--size", str(size), "--seed", str(seed)], check=True)


def load_set(folder: Path, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The images (N, 3, size, size) in [-1, 1] and labels, through gan_accel's own data path."""
    from gan_accel.data import open_image_data

    data = open_image_data(str(folder), resolution=size, labels="required", log=None)
    images, labels = [], []
    for x, y in data.dataloader(500, shuffle=False, drop_last=False):
        images.append(x)
        labels.append(y)
    order = torch.randperm(len(data.labels), generator=torch.Generator().manual_seed(0))  # class folders are sorted
    return torch.cat(images)[order], torch.cat(labels)[order]


def train_judge(images: torch.Tensor, labels: torch.Tensor, size: int, epochs: int = 4) -> tuple[Judge, float]:
    """The judge trained on all but the last 2,000 images; returns it and its accuracy on those."""
    torch.manual_seed(0)
    judge = Judge(size)
    train_x, train_y, test_x, test_y = images[:-2000], labels[:-2000], images[-2000:], labels[-2000:]
    optimizer = torch.optim.Adam(judge.parameters(), lr=2e-3)
    for _ in range(epochs):
        order = torch.randperm(len(train_x))
        for batch in order.split(128):
            loss = F.cross_entropy(judge(train_x[batch]), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    judge.eval()
    with torch.no_grad():
        accuracy = float((judge(test_x).argmax(1) == test_y).float().mean())
    return judge, accuracy


@torch.no_grad()
def score_run(run: Path, judge: Judge, reference: torch.Tensor) -> dict:
    """Scores of a finished run's generator (its EMA when kept) in the judge's features."""
    from gan_accel.eval.scores import score_features
    from gan_accel import load_generator
    from gan_accel.sampling import sample_images

    G = load_generator(run)
    num = SAMPLES - SAMPLES % (getattr(G, "num_classes", None) or 1)
    images, asked = sample_images(G, num, seed=12345)
    logits = torch.cat([judge(part) for part in images.split(500)])
    features = torch.cat([judge.features(part) for part in images.split(500)])
    scores = score_features(features, reference, seed=0, kid_subset_size=1000)
    shares = torch.bincount(logits.argmax(1), minlength=10).float() / len(logits)
    result = {"fd": scores["fd"], "kid": scores["kid"], "precision": scores["precision"], "recall": scores["recall"],
              "min_class_share": float(shares.min()), "classes_covered": int((shares >= 0.05).sum())}
    if asked is not None:
        result["asked_class_read"] = float((logits.argmax(1) == asked).float().mean())
    return result


def median_rate(run: Path) -> float:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return statistics.median(row["images/s"] for row in rows[1:] or rows)


def train(data: Path, run: Path, size: int, seed: int, flags: list[str], steps: int | None) -> float:
    """One `gan-accel train` in a process of its own; returns its wall time in seconds."""
    command = [sys.executable, "-m", "gan_accel.cli", "train", "--data", str(data), "--resolution", str(size),
               "--output-dir", str(run), "--seed", str(seed), "--no-progress", *flags]
    if steps is not None:
        command += ["--steps", str(steps)]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def steps_for(data: Path, scratch: Path, size: int, flags: list[str], seconds: float) -> int:
    """How many steps of this configuration fit in ``seconds``, from a 40-step probe's median speed."""
    probe = scratch / "probe"
    train(data, probe, size, 0, [*flags, "--log-every", "5", "--checkpoint-every", "1000000"], 40)
    steps_per_second = median_rate(probe) / batch_size(flags)
    subprocess.run(["rm", "-rf", str(probe)], check=True)
    return max(1, int(seconds * steps_per_second))


def batch_size(flags: list[str]) -> int:
    return int(flags[flags.index("--batch-size") + 1]) if "--batch-size" in flags else 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--train-images", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--config", action="append", required=True, metavar="NAME=FLAGS")
    parser.add_argument("--seconds", type=float, default=None, help="train each run for this wall time")
    args = parser.parse_args()
    out = Path(args.out)
    data, judge_set = out / f"rgb_digits_{args.size}px_{args.train_images}", out / f"judge_set_{args.size}px"
    build_set(data, args.train_images, args.size, seed=0)
    build_set(judge_set, JUDGE_IMAGES, args.size, seed=1)
    images, labels = load_set(judge_set, args.size)
    judge, accuracy = train_judge(images, labels, args.size)
    with torch.no_grad():
        reference = torch.cat([judge.features(part) for part in images[-HELD_OUT:].split(500)])
    print(f"judge: {accuracy:.1%} accuracy on 2,000 held-out judge images; reference: {HELD_OUT} held-out images")
    results = {"judge_accuracy": accuracy, "threads": torch.get_num_threads(), "runs": []}
    for spec in args.config:
        name, _, flags = spec.partition("=")
        flags = shlex.split(flags)
        steps = steps_for(data, out, args.size, flags, args.seconds) if args.seconds else None
        for seed in args.seeds:
            run = out / "runs" / f"{name}_seed{seed}"
            if not (run / "generator").exists():
                subprocess.run(["rm", "-rf", str(run)], check=True)
                wall = train(data, run, args.size, seed, flags, steps)
                (run / "wall_seconds.txt").write_text(f"{wall:.1f}\n")
            wall = float((run / "wall_seconds.txt").read_text())
            row = {"config": name, "flags": " ".join(flags), "seed": seed, "wall_s": round(wall, 1),
                   "images_per_s": round(median_rate(run), 1), **score_run(run, judge, reference)}
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    keys = ("fd", "kid", "precision", "recall", "min_class_share", "classes_covered", "asked_class_read")
    print(f"\n| config | seed | wall | images/s | {' | '.join(keys)} |\n|" + " --- |" * (4 + len(keys)))
    for row in results["runs"]:
        values = [f"{row[k]:.3g}" if isinstance(row.get(k), float) else str(row.get(k, "-")) for k in keys]
        print(f"| {row['config']} | {row['seed']} | {row['wall_s']:.0f} s | {row['images_per_s']:.0f} | "
              f"{' | '.join(values)} |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    main()
