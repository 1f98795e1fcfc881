"""How a run folder grows when a run samples often: files, progress.gif, peak memory.

    python benchmarks/run_folder_growth.py --steps 300 --sample-every 1
    python benchmarks/run_folder_growth.py --tree /path/to/another/checkout   # the same run on other code

Runs ``examples/dcgan_mnist.py`` (offline digits, a small DCGAN) once per setting in a process of its
own, then prints one markdown table: the files in the run folder, the step-stamped grids, the GIF's
frames and size, the run's peak resident memory (``ru_maxrss`` from ``os.wait4``) and the wall time.
Settings: the defaults, and ``--keep-samples`` with the values given. A second table measures writing
progress.gif alone for runs of many sample steps (the run's peak memory is set earlier, by the
dataset): the memory the process grows by while writing it (resident size sampled every 5 ms), the
time and the size. Measurements only, no asserts; on a shared machine the wall time is noisy, the
counts and sizes are not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(tree: Path, out: Path, steps: int, every: int, extra: list[str]) -> dict[str, object]:
    """One run of the example from ``tree``'s code into ``out``; what it left and what it took."""
    from PIL import Image

    flags = ["--dataset", "digits", "--data-dir", str(out.parent / "nodata"), "--output-dir", str(out), "--steps",
             str(steps), "--sample-every", str(every), "--batch-size", "8", "--width", "8", "--log-every", "10",
             "--checkpoint-every", str(steps), "--no-progress", *extra]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    with open(out.parent / "log.txt", "w") as log:
        child = subprocess.Popen([sys.executable, str(tree / "examples" / "dcgan_mnist.py"), *flags], env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory
        child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if child.returncode != 0:
        raise SystemExit(f"the run failed: {(out.parent / 'log.txt').read_text()[-2000:]}")
    files = [p for p in out.rglob("*") if p.is_file()]
    with Image.open(out / "progress.gif") as gif:
        frames = gif.n_frames
    return {"files": len(files), "grids": len(list(out.glob("samples_0*.png"))), "gif_frames": frames,
            "gif_mb": (out / "progress.gif").stat().st_size / 1e6, "peak_mb": usage.ru_maxrss / 1024,
            "wall_s": wall}


GIF_PHASE = """
import os, sys, threading, time
from pathlib import Path
from gan_accel.pictures.grids import save_gif
grids, count, frames, out = sorted(Path(sys.argv[1]).glob("samples_0*.png")), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
listed = [grids[i % len(grids)] for i in range(count)]  # a run of `count` sample steps
if frames < count:  # what this checkout's sample saver gives the writer: gif_frames of them, evenly spaced
    from gan_accel.callbacks.sample_saver import gif_steps
    listed = [listed[i - 1] for i in gif_steps(range(1, count + 1), frames)]
def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
peak, done = [0.0], threading.Event()
def watch():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.005)
start, began = rss(), time.perf_counter()
watcher = threading.Thread(target=watch)
watcher.start()
save_gif(listed, out)
done.set()
watcher.join()
print(len(listed), peak[0] - start, time.perf_counter() - began, os.path.getsize(out) / 1e6)
"""


def gif_phase(tree: Path, grids: Path, count: int, frames: int, out: Path) -> list[float]:
    """Writing progress.gif alone, in a fresh process of ``tree``'s code: [frames, MB the process grew while
    writing it, seconds, GIF MB]. The frames are a run's grids, listed ``count`` times in turn."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", GIF_PHASE, str(grids), str(count), str(frames), str(out)], env=env,
                          capture_output=True, text=True, cwd=tree)  # -c puts the working folder first on the path
    if done.returncode != 0:
        raise SystemExit(f"writing the GIF failed: {done.stderr[-2000:]}")
    return [float(x) for x in done.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="0: only the second table")
    parser.add_argument("--sample-every", type=int, default=1)
    parser.add_argument("--keep-samples", type=int, nargs="*", default=[20])
    parser.add_argument("--tree", type=Path, default=None, help="measure another checkout's code too (e.g. before a "
                        "change): its defaults only")
    parser.add_argument("--gif-counts", type=int, nargs="*", default=[300, 2000],
                        help="the second table: progress.gif of runs with this many sample steps")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="gan_accel_growth_"))
    try:
        if args.steps > 0:
            _runs(args)
        if args.gif_counts:
            _gif_table(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _gif_table(args: argparse.Namespace, scratch: Path) -> None:
    """progress.gif alone: the writer's memory and time over runs of many sample steps."""
    grids = scratch / "grids"
    grids.mkdir()
    measure(ROOT, grids / "run", 16, 1, [])  # 16 real grids, listed in turn
    print("\nprogress.gif alone (the grids of a 28x28 DCGAN run, 8x8 samples each), each in a process of its own\n")
    print("| code | sample steps | GIF frames | memory grown while writing MB | s | GIF MB |")
    print("|---|---:|---:|---:|---:|---:|")
    trees = ([(str(args.tree), args.tree, None)] if args.tree else []) + [("this checkout", ROOT, 100)]
    for count in args.gif_counts:
        for name, tree, frames in trees:
            listed, grown, seconds, size = gif_phase(tree, grids / "run", count, frames or count, scratch / "a.gif")
            print(f"| {name} | {count} | {listed:.0f} | {grown:.0f} | {seconds:.1f} | {size:.1f} |", flush=True)
        if args.tree:
            listed, grown, seconds, size = gif_phase(ROOT, grids / "run", count, count, scratch / "a.gif")
            print(f"| this checkout, every frame (gif_frames={count}) | {count} | {listed:.0f} | {grown:.0f} | "
                  f"{seconds:.1f} | {size:.1f} |", flush=True)


def _runs(args: argparse.Namespace) -> None:
    settings = [("this checkout, defaults", ROOT, [])]
    settings += [(f"this checkout, --keep-samples {k}", ROOT, ["--keep-samples", str(k)]) for k in args.keep_samples]
    if args.tree is not None:
        settings.insert(0, (f"{args.tree}, defaults", args.tree, []))
    print(f"{args.steps} steps, a grid every {args.sample_every} step(s); each run in a process of its own\n")
    print("| code and setting | files in the run | step grids | GIF frames | GIF MB | peak RSS MB | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, tree, extra in settings:
        scratch = Path(tempfile.mkdtemp(prefix="gan_accel_growth_"))
        try:
            row = measure(tree, scratch / "run", args.steps, args.sample_every, extra)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print(f"| {name} | {row['files']} | {row['grids']} | {row['gif_frames']} | {row['gif_mb']:.1f} | "
              f"{row['peak_mb']:.0f} | "
              f"{row['wall_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
