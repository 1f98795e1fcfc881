"""Quality of `gan-accel train` on real image folders: icons, clip-art and few-shot sets, scored by judges
trained apart, with a copy check, against the classic DCGAN loop at equal wall time.

    apt-get install oxygen-icon-theme openclipart-png                  # the real sets (Debian packages)
    python benchmarks/real_folders.py --out runs/real --sanity        # build the sets and judges, check them
    python benchmarks/real_folders.py --out runs/real --sets icons32 icons100 digits100 --seeds 0 1 \
        --jobs 2 --seconds 900 --reference --config "default=" --config "none=--augment none"

The sets (built once under ``<out>/sets``; every image flattened onto white and saved as RGB PNG):

* ``icons64`` / ``icons32``: Debian's Oxygen icon theme, its 64x64 folder (823 entries, 590 distinct
  images once links and repeated files count once), its 9 category folders as classes (mimetypes 170,
  apps 149, ... emblems 3); 32 px by Pillow's Lanczos filter. 10 % (seed 0) is held out of training
  for the copy check, so 531 icons train.
* ``icons100``: 100 of the training icons at 32 px (seed 0); held out: the same held-out icons.
* ``digits100``: 100 coloured digits at 32 px (``make_rgb_digits.py``, seed 0); held out: 500 others.
* ``clipart32``: Debian's openclipart-png, every PNG padded to a square on white and resized to 32 px,
  its top-level category folders with at least 60 images as classes (15 of 22: 6,746 images, 6,071
  of them training).

The judge of each family (icons, clip-art, digits), independent of training: the compact CNN classifier
of ``own_images_quality.py`` trained on 85 % of all the family's real images (training and held-out
alike) to tell their category, with random shifts; its accuracy on the other 15 % is printed. Samples
are scored against every real image of the family in its 128-d features: the Frechet distance (FD),
KID, precision and recall (k = 3). ``--sanity`` checks each judge first: real against real (the two
halves), blurred reals, one real image repeated, and uniform noise must rank in that order.

The copy check, in pixels at the training size: each sample's distance to its nearest training image,
against the held-out real images' distances to theirs. ``copies`` is the share of samples closer than
the held-out images' 10th percentile: a generator that learnt the distribution has about 10 %, one
that returns its training images has far more.

A class-conditional run (``--config "cond=--conditional"``: the category folders are its classes) is asked
for its classes in their shares of the training images, and ``agreement`` is the share of its samples the
judge puts in the class asked for (the judge's own accuracy on held-out reals is its ceiling).

Each configuration (``--config NAME=FLAGS``, flags of ``gan-accel train``; empty: the default command)
trains once per seed and set, ``--jobs`` at a time with ``cores / jobs`` threads each, capped at
``--seconds`` (``--max-time``) so configurations are compared at equal wall time; ``--reference`` adds
the classic DCGAN loop given the same time. D's health over the last fifth of the run is read from
``metrics.jsonl``. Results: a Markdown table on stdout and ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from own_images_quality import Judge, read_folder, results_table, run_facts, train_run  # noqa: E402

ICONS = Path("/usr/share/icons/oxygen/base")
CLIPART = Path("/usr/share/openclipart/png")
SAMPLES = 2_000
COPY_QUANTILE = 0.10


@dataclass(frozen=True)
class RealSet:
    """A benchmark set: its training folder, held-out folder and judge family."""

    name: str
    family: str  # whose judge scores it: "icons32", "icons64", "clipart32" or "digits32"
    size: int


SETS = {s.name: s for s in (RealSet("icons64", "icons64", 64), RealSet("icons32", "icons32", 32),
                            RealSet("icons100", "icons32", 32), RealSet("digits100", "digits32", 32),
                            RealSet("clipart32", "clipart32", 32))}


# -- building the sets ----------------------------------------------------------------------------------
def flatten_square(path: Path, size: int) -> np.ndarray:
    """An image file as a size x size RGB array: transparency onto white, padded to a square, Lanczos."""
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        rgba = img.convert("RGBA")
    side = max(rgba.size)
    canvas = Image.new("RGBA", (side, side), (255, 255, 255, 255))
    canvas.alpha_composite(rgba, ((side - rgba.width) // 2, (side - rgba.height) // 2))
    rgb = canvas.convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(rgb)


def distinct_files(root: Path, min_per_class: int = 1) -> list[tuple[Path, str]]:
    """(file, class) for every PNG under ``root``'s class folders, links resolved, duplicates (by content)
    dropped, classes with fewer than ``min_per_class`` files left out; sorted."""
    seen, found = set(), {}
    for path in sorted(root.rglob("*.png")):
        real = path.resolve()
        digest = hashlib.sha256(real.read_bytes()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        found.setdefault(path.relative_to(root).parts[0], []).append(real)
    return [(path, cls) for cls, paths in sorted(found.items()) if len(paths) >= min_per_class for path in paths]


def write_images(files: list[tuple[Path, str]], folder: Path, size: int) -> None:
    from PIL import Image

    for index, (path, cls) in enumerate(files):
        try:
            array = flatten_square(path, size)
        except (OSError, Image.DecompressionBombError):  # a few clip-art files are broken or huge: skipped
            continue
        (folder / cls).mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(folder / cls / f"{index:05d}.png")


def split(files: list, held_out_share: float, seed: int = 0) -> tuple[list, list]:
    order = np.random.default_rng(seed).permutation(len(files))
    cut = int(round(len(files) * held_out_share))
    return [files[i] for i in order[cut:]], [files[i] for i in order[:cut]]


def build_family(out: Path, family: str) -> Path:
    """All real images of a judge family, in class folders (built once)."""
    folder = out / "sets" / f"{family}_all"
    if (folder / ".done").exists():
        return folder
    size = int(family[-2:])
    if family.startswith("icons"):
        write_images(distinct_files(ICONS / "64x64"), folder, size)
    elif family.startswith("clipart"):
        write_images(distinct_files(CLIPART, min_per_class=60), folder, size)
    else:
        subprocess.run([sys.executable, str(HERE / "make_rgb_digits.py"), "--out", str(folder), "--num", "3000",
                        "--size", str(size), "--seed", "1"], check=True)
    (folder / ".done").write_text("")
    return folder


def build_set(out: Path, real_set: RealSet) -> tuple[Path, Path]:
    """The set's training and held-out folders (built once)."""
    base = out / "sets" / real_set.name
    train, held_out = base / "train", base / "heldout"
    if (base / ".done").exists():
        return train, held_out
    if real_set.name == "digits100":
        for folder, num, seed in ((train, 100, 0), (held_out, 500, 2)):
            subprocess.run([sys.executable, str(HERE / "make_rgb_digits.py"), "--out", str(folder), "--num",
                            str(num), "--size", "32", "--seed", str(seed)], check=True)
    else:
        family = build_family(out, real_set.family)
        files = [(path, path.parent.name) for path in sorted(family.rglob("*.png"))]
        kept, held = split(files, 0.10)
        if real_set.name == "icons100":
            kept = split(kept, 1 - 100 / len(kept), seed=1)[0]
        for folder, chosen in ((train, kept), (held_out, held)):
            write_images(chosen, folder, real_set.size)
    (base / ".done").write_text("")
    return train, held_out


# -- the judges ------------------------------------------------------------------------------------------
def labelled(folder: Path) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    paths = sorted(folder.rglob("*.png"))
    classes = sorted({path.parent.name for path in paths})
    labels = torch.tensor([classes.index(path.parent.name) for path in paths])
    return read_folder(folder), labels, classes


def shifted(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Random translations by up to ``pad`` pixels (white fill: the sets' background)."""
    padded = F.pad(x, [pad] * 4, value=1.0)
    dx, dy = np.random.randint(0, 2 * pad + 1, size=2)
    return padded[:, :, dy:dy + x.shape[2], dx:dx + x.shape[3]]


def train_judge(images: torch.Tensor, labels: torch.Tensor, classes: int, epochs: int) -> tuple[Judge, float]:
    """The judge on 85 % of the images (seed 0); returns it and its accuracy on the other 15 %."""
    torch.manual_seed(0)
    np.random.seed(0)
    order = torch.randperm(len(images))
    cut = int(len(images) * 0.85)
    train, test = order[:cut], order[cut:]
    judge = Judge(classes=classes)
    optimizer = torch.optim.Adam(judge.parameters(), lr=2e-3)
    for _ in range(epochs):
        judge.train()
        for batch in train[torch.randperm(len(train))].split(64):
            loss = F.cross_entropy(judge(shifted(images[batch], images.shape[-1] // 8)), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    judge.eval()
    with torch.no_grad():
        accuracy = float((judge(images[test]).argmax(1) == labels[test]).float().mean())
    return judge, accuracy


def cached_judge(out: Path, family: str) -> tuple[Judge, float, torch.Tensor, list[str]]:
    """A family's judge (kept as safetensors), its held-out accuracy, all real images and the classes."""
    from safetensors.torch import load_file, save_file

    images, labels, classes = labelled(build_family(out, family))
    path = out / f"judge_{family}.safetensors"
    if path.exists():
        judge, state = Judge(classes=len(classes)), load_file(path)
        accuracy = float(state.pop("accuracy"))
        judge.load_state_dict(state)
        judge.eval()
    else:
        epochs = max(6, min(60, 30_000 // len(images)))
        judge, accuracy = train_judge(images, labels, len(classes), epochs)
        save_file({**judge.state_dict(), "accuracy": torch.tensor(accuracy)}, str(path))
    return judge, accuracy, images, classes


@torch.no_grad()
def features(judge: Judge, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [(judge.features(part), judge(part)) for part in images.split(500)]
    return torch.cat([f for f, _ in parts]), torch.cat([logits for _, logits in parts])


def scores(judge: Judge, images: torch.Tensor, real_features: torch.Tensor, classes: int) -> dict:
    from gan_accel.eval.scores import score_features

    fake, logits = features(judge, images)
    subset = min(1000, len(fake), len(real_features))
    s = score_features(fake, real_features, seed=0, kid_subset_size=subset)
    shares = torch.bincount(logits.argmax(1), minlength=classes).float() / len(logits)
    return {"fd": s["fd"], "kid": s["kid"], "precision": s["precision"], "recall": s["recall"],
            "top_class_share": float(shares.max())}


# -- the copy check ------------------------------------------------------------------------------------
def nearest_distances(queries: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """Each query's pixel distance (RMS over pixels and channels, images in [-1, 1]) to its nearest in pool."""
    flat_pool = pool.flatten(1)
    best = [torch.cdist(part.flatten(1), flat_pool).min(1).values for part in queries.split(256)]
    return torch.cat(best) / math.sqrt(flat_pool.shape[1])


def copy_check(samples: torch.Tensor, train: torch.Tensor, held_out: torch.Tensor) -> dict:
    """``copies``: the share of samples nearer their nearest training image than the held-out reals' 10th
    percentile (about 0.10 for a generator that learnt the distribution); the medians of both."""
    held = nearest_distances(held_out, train)
    mine = nearest_distances(samples, train)
    threshold = float(torch.quantile(held, COPY_QUANTILE))
    return {"copies": float((mine < threshold).float().mean()), "nn_median": float(mine.median()),
            "heldout_nn_median": float(held.median())}


# -- the sanity table -------------------------------------------------------------------------------
def blurred(images: torch.Tensor, sigma: float) -> torch.Tensor:
    from torchvision.transforms.functional import gaussian_blur

    return gaussian_blur(images, kernel_size=2 * math.ceil(2 * sigma) + 1, sigma=sigma)


def sanity(out: Path, family: str) -> list[dict]:
    """Each judge on known cases: real halves, blurred reals, one image repeated, noise."""
    judge, accuracy, images, classes = cached_judge(out, family)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1))
    half_a, half_b = images[order[: len(images) // 2]], images[order[len(images) // 2:]]
    reference, _ = features(judge, half_b)
    cases = {"real (other half)": half_a, "real, blurred (sigma 1 px)": blurred(half_a, 1.0),
             "real, blurred (sigma 2 px)": blurred(half_a, 2.0),
             "one real image repeated": half_a[:1].expand_as(half_a).clone(),
             "uniform noise": torch.rand_like(half_a) * 2 - 1}
    rows = []
    for name, case in cases.items():
        row = {"judge": family, "accuracy": round(accuracy, 3), "case": name,
               **scores(judge, case, reference, len(classes))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# -- the runs ----------------------------------------------------------------------------------------
def d_health(run: Path) -> dict:
    """D over the last fifth of the logged rows: mean loss/D and loss/G, D(x) - D(G(z)), a verdict from the losses
    ("dead", "separates" or "ok"), and the health monitor's probe values where the run logged them."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if "loss/D" in row]
    tail = rows[-max(1, len(rows) // 5):]
    mean = lambda key: statistics.fmean(row[key] for row in tail if key in row) if any(key in r for r in tail) \
        else math.nan  # noqa: E731
    loss_d, loss_g, gap = mean("loss/D"), mean("loss/G"), mean("D(x)") - mean("D(G(z))")
    # "separates": D tells every real from every fake (loss/D near 0); whether by memorising the training images
    # (a runaway D) or by judging G's samples rightly, only the held-out view ("overfit") tells.
    verdict = "dead" if abs(loss_d - math.log(2)) < 0.01 and abs(gap) < 0.05 else \
        "separates" if loss_d < 0.15 else "ok"
    health = {"end_loss_D": round(loss_d, 3), "end_loss_G": round(loss_g, 3), "end_margin": round(gap, 3),
              "d_verdict": verdict}
    for key in ("health/overfit", "health/d_spread", "health/rt", "augment/p"):
        value = mean(key)
        if math.isfinite(value):
            health[key.split("/")[-1]] = round(value, 3)
    return health


def samples_of(run: Path, num: int) -> torch.Tensor:
    """A finished run's samples (its generator, the EMA when kept), or a reference loop's."""
    return labelled_samples(run, num)[0]


def labelled_samples(run: Path, num: int) -> tuple[torch.Tensor, list[str] | None]:
    """``num`` samples of a run and, for a class-conditional run, the class name asked of each. A conditional
    run's classes are drawn in their shares of its training images (seeded), so that its samples are scored
    against the real images as they are mixed, not a uniform mix of rare and common classes."""
    if (run / "samples.pt").exists():
        return torch.load(run / "samples.pt", weights_only=True)[:num], None
    from gan_accel import load_generator
    from gan_accel.sampling import sample_images

    G = load_generator(run)
    if not getattr(G, "num_classes", None):
        return sample_images(G, num, seed=12345)[0], None
    record = json.loads((run / "data.json").read_text())
    names = record["class_names"]
    counts = torch.tensor([len(list((Path(record["source"]) / name).glob("*.png"))) for name in names],
                          dtype=torch.float)
    drawn = torch.multinomial(counts, num, replacement=True, generator=torch.Generator().manual_seed(12345))
    images, asked = [], []
    for label, count in enumerate(torch.bincount(drawn, minlength=len(names)).tolist()):
        if count:
            images.append(sample_images(G, count, label=label, seed=12345 + label)[0])
            asked += [names[label]] * count
    return torch.cat(images), asked


def agreement(judge: Judge, images: torch.Tensor, asked: list[str], classes: list[str]) -> float:
    """The share of a conditional run's samples that the judge puts in the class they were asked for."""
    _, logits = features(judge, images)
    wanted = torch.tensor([classes.index(name) for name in asked])
    return float((logits.argmax(1) == wanted).float().mean())


def figure(out: Path, real_set: RealSet, names: list[str], seed: int, path: Path, per_row: int = 12,
           rows_each: int = 1) -> None:
    """One picture: ``rows_each`` rows of real training images, then as many rows of samples of each run in
    ``names`` (its seed ``seed``), upscaled to at least 64 px per image; the docs' caption names the rows."""
    from PIL import Image
    from torchvision.utils import make_grid

    train, _ = build_set(out, real_set)
    count = per_row * rows_each
    order = torch.randperm(len(list(train.rglob("*.png"))), generator=torch.Generator().manual_seed(seed))
    rows = [read_folder(train)[order[:count]]]
    rows += [samples_of(out / "runs" / real_set.name / f"{name}_seed{seed}", count) for name in names]
    grid = make_grid(torch.cat(rows).clamp(-1, 1), nrow=per_row, padding=2, normalize=True, value_range=(-1, 1),
                     pad_value=1.0)
    image = Image.fromarray(grid.mul(255).round().byte().permute(1, 2, 0).numpy())
    scale = max(1, 64 // real_set.size)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST).save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sets", nargs="+", default=["icons32", "icons100", "digits100"], choices=sorted(SETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--config", action="append", default=[], metavar="NAME=FLAGS")
    parser.add_argument("--seconds", type=float, default=900.0, help="every run's wall time (--max-time)")
    parser.add_argument("--reference", action="store_true", help="add the classic DCGAN loop at equal time")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each with cores/jobs threads")
    parser.add_argument("--sanity", action="store_true", help="build the sets and judges and check the judges")
    parser.add_argument("--figure", metavar="PNG", help="draw real images and samples of each --config (first "
                        "seed) per set into PNG (one file per set: the set's name is added), then stop")
    parser.add_argument("--figure-rows", type=int, default=1, help="rows of 12 images for each in --figure")
    args = parser.parse_args()
    out = Path(args.out)
    chosen = [SETS[name] for name in args.sets]
    for real_set in chosen:
        build_set(out, real_set)
    if args.sanity:
        rows = [row for family in sorted({s.family for s in chosen}) for row in sanity(out, family)]
        (out / "sanity.json").write_text(json.dumps(rows, indent=2) + "\n")
        print("\n| judge | accuracy | case | FD | KID | precision | recall |\n| --- | --- | --- | --- | --- | --- | --- |")
        for row in rows:
            print(f"| {row['judge']} | {row['accuracy']:.1%} | {row['case']} | {row['fd']:.3g} | {row['kid']:.3g} | "
                  f"{row['precision']:.2f} | {row['recall']:.2f} |")
        if not args.config and not args.reference:
            return
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    configs = [(name, shlex.split(flags)) for name, _, flags in (spec.partition("=") for spec in args.config)]
    if args.reference:
        configs.append(("reference", []))
    if args.figure:
        for real_set in chosen:
            target = Path(args.figure)
            figure(out, real_set, [name for name, _ in configs], args.seeds[0],
                   target.with_name(f"{target.stem}_{real_set.name}{target.suffix}"), rows_each=args.figure_rows)
        return

    def run_one(real_set: RealSet, name: str, flags: list[str], seed: int) -> Path:
        run = out / "runs" / real_set.name / f"{name}_seed{seed}"
        if not (run / "wall_seconds.txt").exists():
            subprocess.run(["rm", "-rf", str(run)], check=True)
            train, _ = build_set(out, real_set)
            train_run(train, run, seed, flags, args.seconds, threads, name == "reference")
        return run

    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {(s.name, name, seed): pool.submit(run_one, s, name, flags, seed)
                   for s in chosen for name, flags in configs for seed in args.seeds}
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"runs": []}
    flags_of = dict(configs)
    for (set_name, name, seed), future in futures.items():
        run = future.result()
        real_set = SETS[set_name]
        judge, _, real_images, classes = cached_judge(out, real_set.family)
        real_features, _ = features(judge, real_images)
        train, held_out = build_set(out, real_set)
        samples, asked = labelled_samples(run, SAMPLES)
        row = {"set": set_name, "config": name, "flags": " ".join(flags_of.get(name, [])), "seed": seed,
               "wall_s": round(float((run / "wall_seconds.txt").read_text()), 1), **run_facts(run),
               **scores(judge, samples, real_features, len(classes)),
               **({} if asked is None else {"agreement": agreement(judge, samples, asked, classes)}),
               **copy_check(samples, read_folder(train), read_folder(held_out)), **d_health(run)}
        results["runs"] = [r for r in results["runs"] if (r["set"], r["config"], r["seed"]) != (set_name, name, seed)]
        results["runs"].append(row)
        print(json.dumps(row), flush=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    print(results_table(results["runs"], ("set", "config", "seed"),
                        ("fd", "kid", "precision", "recall", "copies", "agreement", "d_verdict", "overfit")))


if __name__ == "__main__":
    main()
