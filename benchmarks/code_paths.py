"""How much of the package a user's path and one training step go through: a measure of how easy they are to follow.

    python benchmarks/code_paths.py                 # this checkout
    python benchmarks/code_paths.py --tree OTHER    # another checkout, counted the same way

Two counts, read from Python's profiler hook (``sys.setprofile``), nothing timed:

* files touched by ``gan-accel train --data DIR`` then ``gan-accel export RUN OUT``: the package's files
  with at least one function that ran, module bodies not counted (an import alone touches nothing), out
  of the package's files;
* file boundaries crossed by one D+G step of ``fit`` with the default phases and callbacks: calls from a
  function in one package file into a function in another, in a run of 3 steps less a run of 2 (what
  every run does once, start and end, cancels out).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, os
from pathlib import Path
package = Path(sys.argv[1]).resolve()
mode, work = sys.argv[2], Path(sys.argv[3])
touched, crossings = set(), [0]
def inside(frame):
    name = frame.f_code.co_filename
    return name if name.startswith(str(package)) else None
def files(frame, event, arg):
    if event == "call" and frame.f_code.co_name != "<module>" and (name := inside(frame)):
        touched.add(name)
def boundaries(frame, event, arg):
    if event == "call" and (name := inside(frame)) and frame.f_back is not None:
        caller = inside(frame.f_back)
        if caller and caller != name:
            crossings[0] += 1
if mode == "files":
    sys.setprofile(files)
    from gan_accel.cli import main
    main(["train", "--data", str(work / "photos"), "--output-dir", str(work / "run"), "--steps", "2",
          "--batch-size", "8", "--no-progress"])
    main(["export", str(work / "run"), str(work / "export")])
    sys.setprofile(None)
    print(len(touched), sum(1 for _ in package.rglob("*.py")))
else:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from gan_accel import GANTrainer, TrainConfig
    from gan_accel.models import DCGANDiscriminator, DCGANGenerator
    loader = DataLoader(TensorDataset(torch.rand(64, 1, 28, 28) * 2 - 1), batch_size=16, drop_last=True)
    counts = []
    for steps in (2, 3):
        config = TrainConfig(max_steps=steps, batch_size=16, output_dir=str(work / f"steps{steps}"), progress_bar=False)
        trainer = GANTrainer(DCGANGenerator(width=8), DCGANDiscriminator(width=8), loader, config)
        crossings[0] = 0
        sys.setprofile(boundaries)
        trainer.fit()
        sys.setprofile(None)
        counts.append(crossings[0])
    print(counts[1] - counts[0])
"""


def count(tree: Path, mode: str, work: Path) -> list[int]:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree / "gan_accel"), mode, str(work)], env=env, cwd=work,
                         check=True, capture_output=True, text=True).stdout
    return [int(word) for word in out.split()[-2 if mode == "files" else -1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    tree = args.tree.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, str(Path(__file__).with_name("make_rgb_digits.py")), "--out",
                        str(work / "photos"), "--num", "64", "--size", "32"], check=True, capture_output=True)
        touched, total = count(tree, "files", work)
        crossings, = count(tree, "step", work)
    print(f"package files touched by train --data then export: {touched} of {total}")
    print(f"file boundaries crossed by one D+G step: {crossings}")


if __name__ == "__main__":
    main()
