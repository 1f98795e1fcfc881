"""Quality of `gan-accel train` on a folder of RGB images with known classes, against a plain DCGAN loop.

    python benchmarks/own_images_quality.py --out runs/bench_own --seeds 0 1 --jobs 2 --reference \
        --config "default=" --config "conditional=--conditional"
    python benchmarks/own_images_quality.py --out runs/bench_own --seconds 300 --jobs 2 \
        --config "ns=--loss nonsaturating" --config "rpgan=--loss rpgan --r2-gamma 0.1"   # the same wall time each
    python benchmarks/own_images_quality.py --out runs/bench_few --train-images 100 --jobs 2 \
        --config "default=" --config "none=--augment none"

The data: ``benchmarks/make_rgb_digits.py`` draws MNIST digits in colour on coloured backgrounds, saved
as PNG files in class folders ``0/``-``9/``; the training set (``--train-images``, seed 0: 100 images
for a few-shot case) and the judge's set (10,000 other images, seed 1: other digits, inks and
backgrounds) are built once.

The judge, independent of training: a small CNN classifier (three conv blocks of 32, 64 and 64 channels
with batch norm, a 128-unit layer, 10 logits, in eval mode) trained on the judge's set to tell the digit,
whatever its colours; its accuracy on held-out images is printed. Each run's generator (its EMA when
kept) draws 5,000 samples (a conditional run: 500 of each class); they are scored against 5,000 held-out
judge images in the judge's 128-d features: the Frechet distance (FD, lower is better), KID, precision
and recall (k = 3), and the class coverage read from the judge's predictions: the smallest class share
and the number of classes holding at least 5 % of the samples. A conditional run also reports how often
a sample is read as the class it was asked for. A few-shot run is scored against the same full set.

Each configuration (``--config NAME=FLAGS``, flags of ``gan-accel train``; empty flags: the default
command) trains once per seed in a process of its own, ``--jobs`` at a time, each with its share of the
cores (``torch.set_num_threads``); its wall time is the training command's. ``--seconds S`` caps every
run at S seconds (``--max-time``), so configurations are compared at the same wall time. ``--reference``
adds the floor to beat: the classic DCGAN recipe (Radford et al. 2016: transposed convolutions, batch
norm, Adam 2e-4 with beta1 0.5, batch 128, the non-saturating loss) as a plain PyTorch loop written in
this file, trained for the wall time of the first configuration's run of the same seed (or ``--seconds``).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
JUDGE_IMAGES, HELD_OUT, SAMPLES = 10_000, 5_000, 5_000


class Judge(nn.Module):
    """A compact classifier of 3-channel images in [-1, 1]; ``features`` are its 128-d penultimate layer."""

    def __init__(self, channels: int = 3, classes: int = 10) -> None:
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


class ReferenceG(nn.Module):
    """The classic DCGAN generator (ngf = 64): z -> 4x4 -> ... -> ``size`` px (32 or 64), BN + ReLU, tanh."""

    def __init__(self, z_dim: int = 100, ngf: int = 64, size: int = 32) -> None:
        super().__init__()
        mults = [8, 4, 2, 1] if size == 64 else [4, 2, 1]
        layers = [nn.ConvTranspose2d(z_dim, ngf * mults[0], 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * mults[0]),
                  nn.ReLU(True)]
        for a, b in zip(mults, mults[1:]):
            layers += [nn.ConvTranspose2d(ngf * a, ngf * b, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * b), nn.ReLU(True)]
        self.net = nn.Sequential(*layers, nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z[:, :, None, None])


class ReferenceD(nn.Module):
    """The classic DCGAN discriminator (ndf = 64) for ``size`` px (32 or 64): strided convolutions, BN,
    LeakyReLU 0.2."""

    def __init__(self, ndf: int = 64, size: int = 32) -> None:
        super().__init__()
        mults = [1, 2, 4, 8] if size == 64 else [1, 2, 4]
        layers = [nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)]
        for a, b in zip(mults, mults[1:]):
            layers += [nn.Conv2d(ndf * a, ndf * b, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * b),
                       nn.LeakyReLU(0.2, True)]
        self.net = nn.Sequential(*layers, nn.Conv2d(ndf * mults[-1], 1, 4, 1, 0, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).flatten()


def init_dcgan(module: nn.Module) -> None:
    """DCGAN's initialisation: conv weights N(0, 0.02), BN weights N(1, 0.02), biases 0."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


def read_folder(folder: Path) -> torch.Tensor:
    """Every PNG under ``folder`` as one float tensor in [-1, 1], read with Pillow (not gan_accel's data path)."""
    from PIL import Image

    arrays = [np.asarray(Image.open(path).convert("RGB")) for path in sorted(folder.rglob("*.png"))]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float().div(127.5).sub(1)


def train_reference(data: Path, out: Path, seed: int, seconds: float) -> None:
    """The plain loop: D then G on each batch of 128, until ``seconds`` have passed; saves 5,000 samples."""
    torch.manual_seed(seed)
    images = read_folder(data)
    G, D = ReferenceG(size=images.shape[-1]), ReferenceD(size=images.shape[-1])
    G.apply(init_dcgan)
    D.apply(init_dcgan)
    opt_G = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_D = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    start, steps, batch = time.perf_counter(), 0, min(128, len(images))
    while time.perf_counter() - start < seconds:
        for index in torch.randperm(len(images)).split(batch):
            if len(index) < batch or time.perf_counter() - start >= seconds:
                break
            real, z = images[index], torch.randn(batch, 100)
            fake = G(z)
            loss_D = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
            opt_D.zero_grad()
            loss_D.backward()
            opt_D.step()
            loss_G = F.softplus(-D(fake)).mean()
            opt_G.zero_grad()
            loss_G.backward()
            opt_G.step()
            steps += 1
    G.eval()
    with torch.no_grad():
        samples = torch.cat([G(torch.randn(500, 100, generator=torch.Generator().manual_seed(12345 + i)))
                             for i in range(SAMPLES // 500)])
    out.mkdir(parents=True, exist_ok=True)
    torch.save(samples, out / "samples.pt")
    (out / "reference.json").write_text(json.dumps({"steps": steps, "images": steps * batch}) + "\n")


def build_set(folder: Path, num: int, size: int, seed: int) -> None:
    if (folder / "9").is_dir():
        return
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_rgb_digits.py"), "--out", str(folder),
                    "--num", str(num), "--size", str(size), "--seed", str(seed)], check=True)


def judge_set(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The judge's images and labels in one fixed shuffled order (class folders are listed sorted)."""
    paths = sorted(folder.rglob("*.png"))
    labels = torch.tensor([int(path.parent.name) for path in paths])
    order = torch.randperm(len(paths), generator=torch.Generator().manual_seed(0))
    return read_folder(folder)[order], labels[order]


def train_judge(images: torch.Tensor, labels: torch.Tensor, epochs: int = 4) -> tuple[Judge, float]:
    """The judge trained on all but the last 2,000 images; returns it and its accuracy on those."""
    torch.manual_seed(0)
    judge = Judge()
    train_x, train_y, test_x, test_y = images[:-2000], labels[:-2000], images[-2000:], labels[-2000:]
    optimizer = torch.optim.Adam(judge.parameters(), lr=2e-3)
    for _ in range(epochs):
        for batch in torch.randperm(len(train_x)).split(128):
            loss = F.cross_entropy(judge(train_x[batch]), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    judge.eval()
    with torch.no_grad():
        accuracy = float((judge(test_x).argmax(1) == test_y).float().mean())
    return judge, accuracy


def cached_judge(folder: Path, path: Path) -> tuple[Judge, float, torch.Tensor]:
    """:func:`train_judge` on ``folder``, kept in ``path`` (safetensors) so later invocations score with the same
    judge; also returns the held-out images (the last :data:`HELD_OUT` of the shuffled set)."""
    from safetensors.torch import load_file, save_file

    images, labels = judge_set(folder)
    if path.exists():
        judge, state = Judge(), load_file(path)
        accuracy = float(state.pop("accuracy"))
        judge.load_state_dict(state)
        judge.eval()
    else:
        judge, accuracy = train_judge(images, labels)
        save_file({**judge.state_dict(), "accuracy": torch.tensor(accuracy)}, str(path))
    return judge, accuracy, images[-HELD_OUT:]


@torch.no_grad()
def score_samples(images: torch.Tensor, asked: torch.Tensor | None, judge: Judge, reference: torch.Tensor) -> dict:
    """Scores of samples in [-1, 1] in the judge's features (asked: the classes a conditional G was given)."""
    from gan_accel.eval.scores import score_features

    logits = torch.cat([judge(part) for part in images.split(500)])
    features = torch.cat([judge.features(part) for part in images.split(500)])
    scores = score_features(features, reference, seed=0, kid_subset_size=1000)
    shares = torch.bincount(logits.argmax(1), minlength=10).float() / len(logits)
    result = {"fd": scores["fd"], "kid": scores["kid"], "precision": scores["precision"], "recall": scores["recall"],
              "min_class_share": float(shares.min()), "classes_covered": int((shares >= 0.05).sum())}
    if asked is not None:
        result["asked_class_read"] = float((logits.argmax(1) == asked).float().mean())
    return result


def score_run(run: Path, judge: Judge, reference: torch.Tensor) -> dict:
    """A finished `gan-accel train` run (its generator, the EMA when kept), or a reference loop's samples."""
    if (run / "samples.pt").exists():
        return score_samples(torch.load(run / "samples.pt", weights_only=True), None, judge, reference)
    from gan_accel import load_generator
    from gan_accel.sampling import sample_images

    G = load_generator(run)
    num = SAMPLES - SAMPLES % (getattr(G, "num_classes", None) or 1)
    images, asked = sample_images(G, num, seed=12345)
    return score_samples(images, asked, judge, reference)


def run_facts(run: Path) -> dict:
    """Steps, images and the median images/s of a finished run (either kind)."""
    if (run / "reference.json").exists():
        facts = json.loads((run / "reference.json").read_text())
        wall = float((run / "wall_seconds.txt").read_text())
        return {**facts, "images_per_s": round(facts["images"] / wall, 1)}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = {row["step"]: row for row in rows}  # a repeated step supersedes the earlier row
    last = rows[max(rows)]
    rates = [row["images/s"] for step, row in sorted(rows.items())][1:] or [last["images/s"]]
    return {"steps": max(rows), "images_per_s": round(statistics.median(rates), 1),
            "health_nan": any(not np.isfinite(v) for row in rows.values() for v in row.values()
                              if isinstance(v, float))}


def train_run(data: Path, run: Path, seed: int, flags: list[str], seconds: float | None, threads: int,
              reference: bool) -> float:
    """One run in a process of its own with ``threads`` threads; returns its wall time in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if reference:
        command = [sys.executable, __file__, "--reference-run", str(run), "--data", str(data), "--seed", str(seed),
                   "--seconds", str(seconds)]
    else:
        command = [sys.executable, "-m", "gan_accel.cli", "train", "--data", str(data), "--output-dir", str(run),
                   "--seed", str(seed), "--no-progress", *flags]
        if seconds is not None:
            command += ["--max-time", f"{seconds:.0f}s"]
    run.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(f"{run}.log", "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - start
    (run / "wall_seconds.txt").write_text(f"{wall:.1f}\n")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=False)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--train-images", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--config", action="append", default=[], metavar="NAME=FLAGS")
    parser.add_argument("--seconds", type=float, default=None, help="cap each run at this wall time")
    parser.add_argument("--reference", action="store_true", help="add the plain DCGAN loop at equal wall time")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each with cores/jobs threads")
    parser.add_argument("--reference-run", default=None, help=argparse.SUPPRESS)  # the loop's own process
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference_run:
        return train_reference(Path(args.data), Path(args.reference_run), args.seed, args.seconds)
    if not args.out or not (args.config or args.reference):
        parser.error("--out and at least one --config (or --reference) are needed")
    out = Path(args.out)
    data, judge_set = out / f"rgb_digits_{args.size}px_{args.train_images}", out / f"judge_set_{args.size}px"
    build_set(data, args.train_images, args.size, seed=0)
    build_set(judge_set, JUDGE_IMAGES, args.size, seed=1)
    judge, accuracy, held_out = cached_judge(judge_set, out / "judge.safetensors")
    with torch.no_grad():
        reference = torch.cat([judge.features(part) for part in held_out.split(500)])
    print(f"judge: {accuracy:.1%} accuracy on 2,000 held-out judge images; reference: {HELD_OUT} held-out images",
          flush=True)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    configs = [(name, shlex.split(flags)) for name, _, flags in (spec.partition("=") for spec in args.config)]

    def run_one(name: str, flags: list[str], seed: int, seconds: float | None, is_reference: bool) -> Path:
        run = out / "runs" / f"{name}_seed{seed}"
        if not (run / "wall_seconds.txt").exists():
            subprocess.run(["rm", "-rf", str(run)], check=True)
            train_run(data, run, seed, flags, seconds, threads, is_reference)
        return run

    def budget(seed: int) -> float:  # the reference's wall time: --seconds, else the first config's run's
        if args.seconds or not configs:
            return args.seconds or 300.0
        return float((runs[(configs[0][0], seed)].result() / "wall_seconds.txt").read_text())

    # Submitted in order, so a reference job waits only on runs that have started before it.
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = {(name, seed): pool.submit(run_one, name, flags, seed, args.seconds, False)
                for name, flags in configs for seed in args.seeds}
        if args.reference:
            runs.update({("reference", seed): pool.submit(lambda s: run_one("reference", [], s, budget(s), True), seed)
                         for seed in args.seeds})
    flags_of = dict(configs)
    results = {"judge_accuracy": accuracy, "threads_per_run": threads, "jobs": args.jobs, "runs": []}
    for (name, seed), future in runs.items():
        run = future.result()
        row = {"config": name, "flags": " ".join(flags_of.get(name, [])), "seed": seed,
               "wall_s": round(float((run / "wall_seconds.txt").read_text()), 1), **run_facts(run),
               **score_run(run, judge, reference)}
        results["runs"].append(row)
        print(json.dumps(row), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(results_table(results["runs"], ("config", "seed"), ("fd", "kid", "precision", "recall", "min_class_share",
                                                             "classes_covered", "asked_class_read")))


def results_table(rows: list[dict], leading: tuple[str, ...], keys: tuple[str, ...]) -> str:
    """The runs as a Markdown table: the ``leading`` columns, steps, wall time and images/s, then ``keys``."""
    lines = [f"\n| {' | '.join(leading)} | steps | wall | images/s | {' | '.join(keys)} |",
             "|" + " --- |" * (len(leading) + 3 + len(keys))]
    for row in rows:
        values = [f"{row[k]:.3g}" if isinstance(row.get(k), float) else str(row.get(k, "-")) for k in keys]
        lines.append(f"| {' | '.join(str(row[k]) for k in leading)} | {row['steps']} | {row['wall_s']:.0f} s | "
                     f"{row['images_per_s']:.0f} | {' | '.join(values)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
