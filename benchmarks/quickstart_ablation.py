"""The quickstart's ablation: one change at a time from a base, two seeds each, scored the same way.

    python benchmarks/quickstart_ablation.py --data-dir ../shared/data              # train + score
    python benchmarks/quickstart_ablation.py --data-dir ../shared/data --only score # score existing runs

Every configuration is examples/dcgan_mnist.py with extra flags. Runs go two at a time (one CPU
thread each, so on a 2-core machine both cores work; the wall times are therefore those of a shared
machine, an upper bound on a run alone). The first row is the plain pytorch/examples-style loop of
benchmarks/quality_vs_plain.py, trained for the base configuration's median wall time. Each run's
exported generator (the EMA when the run keeps one) is scored with gan_accel.eval.mnist
(10,000 samples against held-out MNIST, in the MNIST classifier's feature space), and the table
gives each seed's numbers and their mean.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The base: the quickstart's defaults before this ablation (5,000 steps, no R1). Every row adds its flags
# to the base's (a later flag wins), one change at a time; the last row combines the best change with
# twice the steps.
BASE_FLAGS = "--steps 5000 --r1-gamma 0"
CONFIGS = {
    "base: lr 1e-3, EMA 0.99": "",
    "+ EMA BatchNorm statistics recomputed": "--ema-batchnorm recompute",
    "+ EMA half-life 10k images, ramp-up 0.05": "--ema-half-life 10000 --ema-rampup 0.05",
    "+ spectral norm in D": "--spectral-norm",
    "+ 12,000 steps": "--steps 12000",
    "+ TTUR (lr G 5e-4, D 1e-3)": "--lr-g 5e-4",
    "+ hinge loss": "--loss hinge",
    "+ lazy R1 (gamma 0.1): the new defaults": "--r1-gamma 0.1",
    "+ lazy R1 (gamma 0.1) + 10,000 steps": "--r1-gamma 0.1 --steps 10000",
}


def train(name: str, flags: str, seed: int, data_dir: str, out: Path, base: str = BASE_FLAGS) -> dict:
    folder = out / slug(name) / f"seed{seed}"
    result_file = folder / "ablation.json"
    if result_file.exists():  # already trained: keep it (rerun with a fresh --out to train again)
        return json.loads(result_file.read_text())
    shutil.rmtree(folder, ignore_errors=True)  # an unfinished run of this benchmark: trained again from the start
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "examples" / "dcgan_mnist.py"), "--data-dir", data_dir, "--dataset", "mnist",
           "--output-dir", str(folder), "--no-progress", "--seed", str(seed), *shlex.split(base), *shlex.split(flags)]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    record = {"name": name, "flags": flags, "seed": seed, "seconds": time.perf_counter() - start}
    result_file.write_text(json.dumps(record))
    return record


def train_plain(seconds: float, seed: int, data_dir: str, out: Path) -> dict:
    folder = out / "plain" / f"seed{seed}"
    result_file = folder / "ablation.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    shutil.rmtree(folder, ignore_errors=True)  # an unfinished run of this benchmark: trained again from the start
    folder.mkdir(parents=True, exist_ok=True)
    code = (f"import sys, torch; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); torch.set_num_threads(1)\n"
            "from quality_vs_plain import plain_dcgan\n"
            "from safetensors.torch import save_file\n"
            f"G, steps = plain_dcgan({data_dir!r}, {seconds!r}, seed={seed})\n"
            f"save_file(G.state_dict(), {str(folder / 'generator.safetensors')!r})\n"
            f"open({str(folder / 'steps')!r}, 'w').write(str(steps))\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    record = {"name": "plain pytorch/examples loop (width 64, batch 128, lr 2e-4), equal wall time",
              "flags": "", "seed": seed, "seconds": seconds, "steps": int((folder / "steps").read_text())}
    result_file.write_text(json.dumps(record))
    return record


def score(folder: Path, data_dir: str) -> dict:
    """The MNIST evaluation of a run folder's exported generator (cached in score.json)."""
    cached = folder / "score.json"
    if cached.exists():
        return json.loads(cached.read_text())
    from gan_accel.eval.mnist import evaluate_generator
    from gan_accel.models import DCGANGenerator
    from gan_accel import load_generator
    from gan_accel.storage.weights import load_weights

    config_file = folder / "config.json"
    if config_file.exists():  # a gan_accel run: G rebuilt from its recorded spec
        G = load_generator(folder)
    else:  # the plain loop's DCGAN
        G = load_weights(DCGANGenerator(100, 64), folder / "generator.safetensors")
    result = evaluate_generator(G, data_dir, z_dim=G.z_dim)
    if not config_file.exists():  # the plain loop: score BatchNorm in train mode too, keep the better
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from ablation import TrainModeG

        train_mode = evaluate_generator(TrainModeG(G), data_dir, z_dim=G.z_dim)
        result = min(result, train_mode, key=lambda r: r["fd"])
    result = {k: v for k, v in result.items() if k != "summary"}
    cached.write_text(json.dumps(result))
    return result


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")[:60]


def table(rows: list[tuple[str, list[dict], list[dict]]]) -> str:
    def both(values: list[float], fmt: str) -> str:
        mean = sum(values) / len(values)
        return " / ".join(format(v, fmt) for v in values) + f" (**{format(mean, fmt)}**)"

    lines = ["| configuration | wall s | FD | KID | precision | recall | digit share min-max |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, records, scores in rows:
        seconds = " / ".join(f"{r['seconds']:.0f}" for r in records)
        shares = " / ".join(f"{s['min_class_share']:.1%}-{s['max_class_share']:.1%}" for s in scores)
        kid = both([s["kid"] for s in scores], ".2f") if "kid" in scores[0] else "-"
        precision = both([s["precision"] for s in scores], ".2f") if "precision" in scores[0] else "-"
        recall = both([s["recall"] for s in scores], ".2f") if "recall" in scores[0] else "-"
        lines.append(f"| {name} | {seconds} | {both([s['fd'] for s in scores], '.1f')} | {kid} | {precision} | "
                     f"{recall} | {shares} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("GAN_ACCEL_DATA_DIR", "../shared/data"))
    parser.add_argument("--out", default="runs/quickstart_ablation")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--configs", nargs="*", default=None, help="names of CONFIGS to run (default: all)")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=FLAGS",
                        help="another configuration, e.g. 'width 48=--width 48' (repeatable)")
    parser.add_argument("--base", default=BASE_FLAGS, help=f"flags every configuration starts from ({BASE_FLAGS!r}; "
                        "'' for the quickstart's current defaults)")
    parser.add_argument("--only", choices=("train", "score"), default=None)
    parser.add_argument("--no-plain", action="store_true", help="skip the plain-loop row")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()

    configs = {k: v for k, v in CONFIGS.items() if args.configs is None or k in args.configs}
    configs.update(dict(item.split("=", 1) for item in args.extra))
    out = Path(args.out)
    jobs = [(name, flags, seed) for name, flags in configs.items() for seed in args.seeds]
    if args.only != "score":
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda job: train(*job, args.data_dir, out, args.base), jobs))
        base = out / slug(next(iter(configs))) / f"seed{args.seeds[0]}" / "ablation.json"
        if not args.no_plain and base.exists():
            seconds = json.loads(base.read_text())["seconds"]
            with ThreadPoolExecutor(args.parallel) as pool:
                list(pool.map(lambda seed: train_plain(seconds, seed, args.data_dir, out), args.seeds))
    if args.only == "train":
        return
    rows = []
    plain = [out / "plain" / f"seed{seed}" for seed in args.seeds]
    if all((p / "ablation.json").exists() for p in plain):
        rows.append((json.loads((plain[0] / "ablation.json").read_text())["name"],
                     [json.loads((p / "ablation.json").read_text()) for p in plain],
                     [score(p, args.data_dir) for p in plain]))
    for name in configs:
        folders = [out / slug(name) / f"seed{seed}" for seed in args.seeds]
        if all((f / "ablation.json").exists() for f in folders):
            rows.append((name, [json.loads((f / "ablation.json").read_text()) for f in folders],
                         [score(f, args.data_dir) for f in folders]))
    text = table(rows)
    print(text)
    (out / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
