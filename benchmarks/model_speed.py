"""Training speed and peak memory of each model family at 32, 64, 128 and 256 px.

    python benchmarks/model_speed.py                       # default widths, batch 16, CPU or the GPU
    python benchmarks/model_speed.py --quick               # width 8, batch 4, 2 timed steps: seconds
    python benchmarks/model_speed.py --sizes 128 256 --batch 32 --device cuda --bf16

One *step* is a plain PyTorch D update (non-saturating loss on a real batch and G's detached samples)
then a G update through the frozen D, with Adam, on random data: the models' own cost, no engine.
images/s = batch / median step time (after ``--warmup`` untimed steps). Peak memory: on CUDA
``torch.cuda.max_memory_allocated`` during the timed steps; on CPU the rise of the process's resident
set above its level before the steps (Linux's VmHWM, reset through /proc/self/clear_refs), which counts
what the allocator holds, not only live tensors. Timings only, no asserts; on a machine shared with
other work the numbers are noisy (say so when you quote them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from gan_accel.models import build_models, default_spec, supported_resolutions  # noqa: E402

SIZES = (32, 64, 128, 256)
FAMILIES = ("dcgan", "resnet")


def peak_rss_reset() -> int | None:
    """Reset Linux's peak-RSS mark to the current RSS; the current RSS in bytes (None where unsupported)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_bytes("VmRSS")
    except OSError:
        return None


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field} not in /proc/self/status")


def measure(spec: dict[str, Any], batch: int, steps: int, warmup: int, device: torch.device,
            bf16: bool) -> dict[str, Any]:
    """images/s and peak memory of ``steps`` timed D + G steps of the models ``spec`` describes."""
    torch.manual_seed(0)
    G, D = build_models(spec)
    G, D = G.to(device), D.to(device)
    opt_G = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_D = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = torch.rand(batch, spec["channels"], spec["image_size"], spec["image_size"], device=device) * 2 - 1
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)

    def step() -> None:
        with autocast:
            fake = G(torch.randn(batch, spec["z_dim"], device=device))
            d_loss = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()
        opt_D.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_D.step()
        D.requires_grad_(False)
        with autocast:
            g_loss = F.softplus(-D(fake)).mean()
        opt_G.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_G.step()
        D.requires_grad_(True)

    for _ in range(warmup):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = None if cuda else peak_rss_reset()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if cuda:
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = None if base is None else _status_bytes("VmHWM") - base
    params = [sum(p.numel() for p in net.parameters()) for net in (G, D)]
    return {"images_per_s": batch / statistics.median(times), "peak_bytes": peak, "params": params}


def rows(families: list[str], sizes: list[int], width: int | None, batch: int, steps: int, warmup: int,
         device: torch.device, bf16: bool) -> list[str]:
    """One markdown row per (family, size): the measurement, or why there is none."""
    out = []
    for family in families:
        for size in sizes:
            if size not in supported_resolutions(family):
                out.append(f"| {family} | {size} | - | - | - | - | not made by this family |")
                continue
            spec = default_spec(family, size, channels=3, **({"width": width} if width else {}))
            if family == "resnet":
                spec["d_width"] = spec["width"]
            result = measure(spec, batch, steps, warmup, device, bf16)
            peak = "n/a" if result["peak_bytes"] is None else f"{result['peak_bytes'] / 2**20:.0f}"
            g, d = (n / 1e6 for n in result["params"])
            out.append(f"| {family} | {size} | {spec['width']} | {g:.2f} / {d:.2f} | {result['images_per_s']:.1f} | "
                       f"{peak} | |")
            print(out[-1], file=sys.stderr, flush=True)  # progress: the big models take a while on a CPU
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="width 8, batch 4, 1 warm-up + 2 timed steps")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--width", type=int, default=None, help="base width (default: each family's default)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast around the forwards")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.batch, args.steps, args.warmup = args.width or 8, min(args.batch, 4), 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    memory = "max_memory_allocated" if device.type == "cuda" else "peak RSS rise"
    print(f"\n{name}; torch {torch.__version__}; load average {load}; batch {args.batch}, "
          f"{args.steps} timed steps after {args.warmup}, {'bf16 autocast' if args.bf16 else 'fp32'}"
          f"{' (--quick: tiny widths, not representative)' if args.quick else ''}\n")
    print(f"| family | px | width | params G / D (M) | images/s | {memory} (MiB) | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows(args.families, args.sizes, args.width, args.batch, args.steps, args.warmup, device, args.bf16):
        print(row)


if __name__ == "__main__":
    main()
