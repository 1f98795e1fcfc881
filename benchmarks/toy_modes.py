"""PacGAN's 2-D benchmarks: examples/toy_2d.py's default recipe against a plain hand-written GAN loop.

    python benchmarks/toy_modes.py                # ring and grid, seeds 0 and 1, the example's 12,000 steps
    python benchmarks/toy_modes.py --quick        # 200 steps, seed 0: checks that it runs

Both configurations train the same MLPs (the example's widths and z) for the same number of G steps on the
same 100,000 points (PacGAN's ring of 8, radius 1, std 0.01, and grid of 25, std 0.05) and are scored the
same way on 2,500 samples (gan_accel.eval.toy.mode_coverage: modes captured, high-quality share within
3 std, reverse KL over modes). The plain loop is the classic recipe, written here without gan_accel's
engine: Adam 1e-3, beta1 0.5, batch 256, the non-saturating loss, no penalty. Prints a markdown table
with PacGAN's Table 1 rows for reference.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gan_accel.data import TOY_MIXTURES, gaussian_mixture  # noqa: E402
from gan_accel.eval.toy import mode_coverage  # noqa: E402
from gan_accel.models import MLPDiscriminator, MLPGenerator  # noqa: E402

# PacGAN (Lin et al. 2018), Table 1: modes, high-quality share, reverse KL.
PACGAN = {"ring": [("GAN", 6.3, 98.2, 0.45), ("PacGAN2", 7.9, 95.6, 0.07)],
          "grid": [("GAN", 17.3, 94.8, 0.70), ("PacGAN4", 24.8, 93.6, 0.04)]}


def load_example():
    spec = importlib.util.spec_from_file_location("toy_2d_example", ROOT / "examples" / "toy_2d.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(example, data: str, seed: int, steps: int, extra: list[str]) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        example.main(["--data", data, "--seed", str(seed), "--steps", str(steps), "--output-dir", out,
                      "--sample-every", str(steps), "--log-every", str(steps), "--no-progress", *extra])
        seconds = time.perf_counter() - start
        return json.loads((Path(out) / "eval.json").read_text()), seconds


def plain_gan(data: str, seed: int, steps: int, defaults: argparse.Namespace) -> tuple[dict, float]:
    """The classic loop: one D step on a real and a fake batch, one G step, non-saturating loss."""
    start = time.perf_counter()
    centres, std = TOY_MIXTURES[data]
    points, _ = gaussian_mixture(100_000, centres, std, seed=seed)
    torch.manual_seed(seed)
    G = MLPGenerator(z_dim=defaults.z_dim, hidden=defaults.width, depth=defaults.depth)
    D = MLPDiscriminator(hidden=defaults.width, depth=defaults.depth)
    opt_G = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_D = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    batch = 256
    for step in range(steps):
        if step % (len(points) // batch) == 0:
            order = torch.randperm(len(points))
        k = step % (len(points) // batch)
        real = points[order[k * batch:(k + 1) * batch]]
        fake = G(torch.randn(batch, defaults.z_dim))
        loss_D = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
        opt_D.zero_grad()
        loss_D.backward()
        opt_D.step()
        loss_G = F.softplus(-D(fake)).mean()
        opt_G.zero_grad()
        loss_G.backward()
        opt_G.step()
    with torch.no_grad():
        noise = torch.randn(2500, defaults.z_dim, generator=torch.Generator().manual_seed(10_000 + seed))
        result = mode_coverage(G(noise), centres, std)
    return result, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 steps, seed 0")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=None, help="G steps for every configuration (default: the example's)")
    parser.add_argument("--cases", nargs="+", choices=sorted(TOY_MIXTURES), default=["ring", "grid"])
    parser.add_argument("--example-args", default="", help="extra arguments for examples/toy_2d.py, e.g. '--lr-g 5e-4'")
    args = parser.parse_args(argv)
    example = load_example()
    defaults = example.parse_args([])
    steps = 200 if args.quick else args.steps or defaults.steps
    seeds = [0] if args.quick else args.seeds
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {steps} G steps per run, 2,500 samples scored\n")
    print("| case | configuration | seed | steps | wall s | modes | high quality % | reverse KL |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for case in args.cases:
        for seed in seeds:
            runs = [("gan_accel toy recipe", *run_example(example, case, seed, steps, args.example_args.split())),
                    ("plain loop", *plain_gan(case, seed, steps, defaults))]
            for name, result, seconds in runs:
                print(f"| {case} | {name} | {seed} | {steps} | {seconds:.1f} | {result['modes']}/{result['num_modes']} "
                      f"| {100 * result['high_quality']:.1f} | {result['reverse_kl']:.3f} |", flush=True)
        for name, modes, quality, kl in PACGAN[case]:
            print(f"| {case} | PacGAN Table 1: {name} | mean | | | {modes} | {quality} | {kl} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
