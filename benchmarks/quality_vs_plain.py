"""Sample quality at equal wall-clock time: examples/dcgan_mnist.py versus a plain DCGAN loop.

    python benchmarks/quality_vs_plain.py --data-dir ../shared/data

1. Runs the example with its quickstart defaults (plus any --example-args) and times it.
2. Runs a plain hand-written DCGAN loop, pytorch/examples style (the same 28x28 DCGAN at width 64,
   Adam 2e-4, beta1 0.5, batch 128, non-saturating loss, torchvision's per-item MNIST pipeline),
   for exactly the same number of seconds.
3. Scores 10k samples of each with the cached MNIST classifier (gan_accel.mnist_eval) and prints a
   markdown table. The plain G is scored both in train and eval mode and the better is kept, so the
   comparison never flatters gan_accel.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ablation import TrainModeG  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def run_example(data_dir: str, out: Path, extra: list[str]) -> float:
    cmd = [sys.executable, str(ROOT / "examples" / "dcgan_mnist.py"), "--data-dir", data_dir, "--dataset", "mnist",
           "--output-dir", str(out), "--no-progress", *extra]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def plain_dcgan(data_dir: str, seconds: float, seed: int = 0):
    """The textbook loop, deliberately without anything from gan_accel's engine."""
    from torchvision import datasets, transforms

    from gan_accel.models import DCGANDiscriminator, DCGANGenerator

    torch.manual_seed(seed)
    dataset = datasets.MNIST(data_dir, train=True, download=False, transform=transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True, drop_last=True)
    G, D = DCGANGenerator(z_dim=100, width=64), DCGANDiscriminator(width=64)
    opt_G = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_D = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    ones, zeros = torch.ones(128), torch.zeros(128)
    start, steps = time.perf_counter(), 0
    while True:
        for real, _ in loader:
            fake = G(torch.randn(128, 100))
            opt_D.zero_grad()
            loss_D = (F.binary_cross_entropy_with_logits(D(real), ones)
                      + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros))
            loss_D.backward()
            opt_D.step()
            opt_G.zero_grad()
            F.binary_cross_entropy_with_logits(D(fake), ones).backward()
            opt_G.step()
            steps += 1
            if time.perf_counter() - start >= seconds:
                return G, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument("--out", default="runs/bench_quality")
    parser.add_argument("--example-args", default="", help="extra flags for the example, e.g. '--steps 3000'")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    from gan_accel.eval.mnist import evaluate_generator
    from gan_accel import load_generator

    out = Path(args.out)
    seconds = run_example(args.data_dir, out / "example", shlex.split(args.example_args))
    G_example = load_generator(out / "example")  # rebuilt from the run's recorded spec
    example = evaluate_generator(G_example, args.data_dir, z_dim=G_example.z_dim)

    G_plain, plain_steps = plain_dcgan(args.data_dir, seconds)
    plain_eval = evaluate_generator(G_plain, args.data_dir, z_dim=100)
    plain_train = evaluate_generator(TrainModeG(G_plain), args.data_dir, z_dim=100)
    plain = min((plain_eval, plain_train), key=lambda r: r["fd"])
    plain_mode = "eval" if plain is plain_eval else "train"

    rows = [
        ("gan_accel example (defaults)", info["config"]["max_steps"], example),
        (f"plain DCGAN loop (BN {plain_mode} mode)", plain_steps, plain),
    ]
    print(f"\nEqual wall-clock: {seconds:.0f} s each on {torch.get_num_threads()} threads\n")
    print("| run | G steps | Frechet distance (lower is better) | mean confidence | min class share |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, steps, r in rows:
        print(f"| {name} | {steps} | {r['fd']:.2f} | {r['mean_confidence']:.3f} | {r['min_class_share']:.1%} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": seconds, "rows": [
            {"run": n, "steps": s, **{k: v for k, v in r.items() if k != "summary"}} for n, s, r in rows]}, indent=2))


if __name__ == "__main__":
    main()
