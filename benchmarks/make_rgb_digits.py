"""Build an RGB image set with known classes, offline: MNIST digits drawn in colour on coloured backgrounds.

    python benchmarks/make_rgb_digits.py --out /tmp/rgb_digits --num 10000 --size 64
    python benchmarks/make_rgb_digits.py --out /tmp/bad --num 2000 --corrupt-fraction 0.05 --zip /tmp/bad.zip

How each image is made (deterministic for ``--seed``):

* the digit: an MNIST training digit (from ``--mnist-dir``: $GAN_ACCEL_MNIST_DIR, else ./data, the
  folder holding MNIST/raw), else gan_accel's offline digits rendered from Pillow's font (said on
  stdout); upsampled bilinearly from 28 px to ``--size`` and used as a coverage mask m in [0, 1];
* the ink: one of 8 saturated colours;
* the background: a linear gradient between two random colours at a random angle, times a smooth
  texture (a random 4x4 grid upsampled bicubically, +-15 %); where the background's luminance is within
  80 of the ink's, it is moved away from it, so every digit stays legible;
* pixel = background * (1 - m) + ink * m, saved as PNG in ``<out>/<digit>/<index>.png`` (class folders
  0-9: the class rule of :func:`gan_accel.data.open_image_data` labels them).

``--corrupt-fraction f`` replaces that share of the files (chosen at random) by broken ones, in turn:
a PNG cut to 40 % of its bytes, a text file named .png, an empty file, random bytes named .png.
``--zip`` also writes the folder as a ZIP (stored: PNG is already compressed).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

INKS = np.array([[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48], [145, 30, 180],
                 [70, 240, 240], [240, 50, 230]], dtype=np.float32)
CORRUPTIONS = ("truncated", "not an image", "empty", "random bytes")


def load_digits(num: int, seed: int, mnist_dir: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    """``num`` digits (num, 28, 28) uint8 and their labels, from MNIST when present, else the offline digits."""
    from gan_accel.data import load_mnist_uint8, synthetic_digits

    folder = mnist_dir or os.environ.get("GAN_ACCEL_MNIST_DIR") or "data"
    raw = Path(folder) / "MNIST" / "raw"
    try:
        if not any((raw / name).exists() for name in ("train-images-idx3-ubyte", "train-images-idx3-ubyte.gz")):
            raise FileNotFoundError(raw)  # without trying torchvision (a slow import) for nothing
        images, labels = load_mnist_uint8(folder, train=True, download=False)
        source = f"MNIST training digits from {folder}"
    except (RuntimeError, OSError, EOFError, ValueError):
        images, labels = synthetic_digits(num, seed=seed)
        source = "gan_accel's offline digits (MNIST not found)"
    order = np.random.default_rng(seed).permutation(len(images))[:num]
    if len(order) < num:
        raise SystemExit(f"error: only {len(order)} digits available, fewer than --num {num}")
    return images[order, 0].numpy(), labels[order].numpy(), source


def draw(digits: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Coloured digits: uint8 (n, size, size, 3)."""
    n = len(digits)
    mask = F.interpolate(torch.from_numpy(digits).float()[:, None] / 255, size=(size, size), mode="bilinear",
                         align_corners=False)[:, 0].numpy()[..., None]
    ink = INKS[rng.integers(0, len(INKS), n)][:, None, None, :]
    a = rng.uniform(0, 255, (n, 1, 1, 3)).astype(np.float32)
    b = rng.uniform(0, 255, (n, 1, 1, 3)).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi, (n, 1, 1, 1)).astype(np.float32)
    ys, xs = np.meshgrid(np.linspace(-0.5, 0.5, size, dtype=np.float32), np.linspace(-0.5, 0.5, size, dtype=np.float32),
                         indexing="ij")
    t = (np.cos(angle) * xs[None, ..., None] + np.sin(angle) * ys[None, ..., None]) + 0.5  # (n, size, size, 1)
    background = a * (1 - t) + b * t
    grid = torch.from_numpy(rng.uniform(0.85, 1.15, (n, 1, 4, 4)).astype(np.float32))
    texture = F.interpolate(grid, size=(size, size), mode="bicubic", align_corners=False)[:, 0].numpy()[..., None]
    background = background * texture
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    ink_lum = (ink @ weights)[..., None]
    gap = (background @ weights)[..., None] - ink_lum
    # Keep the background >= 80 luminance levels away from the ink: lighter than a dark ink, darker than a
    # light one (a shift of all three channels moves the luminance by the same amount).
    direction = np.where(ink_lum < 128, 1.0, -1.0)
    background = background + direction * np.maximum(0, 80 - direction * gap)
    pixels = background * (1 - mask) + ink * mask
    return np.clip(pixels, 0, 255).round().astype(np.uint8)


def corrupt(path: Path, kind: str, rng: np.random.Generator) -> None:
    """Replace the file at ``path`` by a broken one of ``kind`` (see CORRUPTIONS)."""
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * 0.4)])
    elif kind == "not an image":
        path.write_text("this is not an image\n")
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(rng.integers(0, 256, 2048, dtype=np.uint8).tobytes())


def make_rgb_digits(out: str | os.PathLike, num: int = 10_000, size: int = 64, seed: int = 0,
                    corrupt_fraction: float = 0.0, zip_path: str | os.PathLike | None = None,
                    mnist_dir: str | None = None) -> dict[str, Any]:
    """Write the set (see the module docstring); returns what was made."""
    out = Path(out)
    rng = np.random.default_rng(seed)
    digits, labels, source = load_digits(num, seed, mnist_dir)
    for label in range(10):
        (out / str(label)).mkdir(parents=True, exist_ok=True)
    paths = []
    for start in range(0, num, 512):
        pixels = draw(digits[start:start + 512], size, rng)
        for offset, image in enumerate(pixels):
            index = start + offset
            path = out / str(int(labels[index])) / f"{index:06d}.png"
            buffer = io.BytesIO()
            Image.fromarray(image, mode="RGB").save(buffer, format="PNG")
            path.write_bytes(buffer.getvalue())
            paths.append(path)
    broken = sorted(rng.choice(num, size=round(num * corrupt_fraction), replace=False).tolist())
    for i, index in enumerate(broken):
        corrupt(paths[index], CORRUPTIONS[i % len(CORRUPTIONS)], rng)
    if zip_path is not None:
        with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED) as archive:
            for path in paths:
                archive.write(path, path.relative_to(out).as_posix())
    return {"out": str(out), "num": num, "size": size, "source": source, "corrupt": [str(paths[i]) for i in broken],
            "labels": labels, "zip": None if zip_path is None else str(zip_path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the folder to write (class subfolders 0-9)")
    parser.add_argument("--num", type=int, default=10_000, help="images (default 10,000; MNIST has 60,000)")
    parser.add_argument("--size", type=int, default=64, help="side in pixels (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corrupt-fraction", type=float, default=0.0, help="share of files replaced by broken ones")
    parser.add_argument("--zip", default=None, help="also write the set as this ZIP file")
    parser.add_argument("--mnist-dir", default=None,
                        help="folder holding MNIST/raw (default $GAN_ACCEL_MNIST_DIR, else ./data)")
    args = parser.parse_args(argv)
    if args.num < 1 or args.size < 8 or not 0 <= args.corrupt_fraction < 1:
        parser.error("--num >= 1, --size >= 8 and 0 <= --corrupt-fraction < 1")
    made = make_rgb_digits(args.out, args.num, args.size, args.seed, args.corrupt_fraction, args.zip, args.mnist_dir)
    broken = f", {len(made['corrupt']):,} of them broken" if made["corrupt"] else ""
    archive = f", and {made['zip']}" if made["zip"] else ""
    print(f"wrote {made['num']:,} {args.size}x{args.size} RGB digits ({made['source']}) to {made['out']}"
          f"{broken}{archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
