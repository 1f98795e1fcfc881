"""``gan-accel sample RUN_OR_CHECKPOINT --out PATH``: samples of a run's generator as a grid, arrays or PNG files.

* ``--format png``: one grid (a conditional run: one row per class, or one class in rows of 10).
* ``--format npz``: ``images`` (N, C, H, W) float32 in [-1, 1] and, for a conditional run, ``labels``.
* ``--format folder``: a new folder of one PNG per sample (``000000.png``, or ``000000_label3.png``
  in a conditional run), quantised as ``round((x + 1) * 127.5)``: what FID tools read.

Without ``--format`` the format follows the ending of ``--out`` (``.png`` or ``.npz``). The same
``--seed`` gives the same latents, hence the same bytes. ``--no-ema`` samples the raw G rather than
its EMA (from a run folder: the raw G of the checkpoint written at the run's last step).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..sampling import load_generator, sample_images
from ..scripts import nonnegative_int, positive_int
from .common import CommandError, check_new_output, resolve_source, write_new_file, write_new_folder
from .labels import label_argument, resolve_label

FORMATS = ("png", "npz", "folder")
SUFFIXES = {".png": "png", ".npz": "npz"}
PER_CLASS = 8  # default samples per class of a conditional run without --label


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "sample", help="write samples of a run's generator: a PNG grid, an .npz of arrays, or a folder of PNGs",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a finished run folder (its generator.safetensors) or a checkpoints/checkpoint_<step> folder")
    parser.add_argument("--out", required=True, help="a new file (.png, .npz) or, with --format folder, a new folder; "
                        "nothing existing is ever replaced")
    parser.add_argument("--num", type=positive_int, default=None,
                        help=f"how many samples (default 64; a conditional run without --label: {PER_CLASS} per class, "
                             "and a multiple of the number of classes)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="the latents' seed: the same seed, the same "
                        "samples (default 0)")
    parser.add_argument("--label", type=label_argument, default=None, metavar="NAME_OR_INDEX",
                        help="a conditional run: sample this class only, by its name (class_names.json) or index "
                             "(default: every class, in equal numbers)")
    parser.add_argument("--no-ema", action="store_true",
                        help="sample the raw G instead of its EMA (a run without an EMA samples its raw G anyway)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="png: a grid; npz: arrays 'images' (N, C, H, W) in [-1, 1] and 'labels'; folder: one PNG "
                             "per sample (default: from the ending of --out)")
    parser.set_defaults(run=run)


def output_format(out: Path, chosen: str | None) -> str:
    """The format: ``--format``, or the ending of ``--out``; a contradiction between them is an error."""
    implied = SUFFIXES.get(out.suffix.lower())
    if chosen is None:
        if implied is None:
            raise CommandError(f"--out {out}: cannot tell the format from its ending; end it in .png (a grid) or .npz "
                              "(arrays), or pass --format png|npz|folder (folder: one PNG per sample)")
        return implied
    if out.suffix.lower() in SUFFIXES and implied != chosen:
        raise CommandError(f"--out {out} ends in {out.suffix} but --format is {chosen}: make them agree (e.g. "
                          f"--out {out.with_suffix('') if chosen == 'folder' else out.with_suffix('.' + chosen)})")
    return chosen


def run(args: argparse.Namespace) -> int:
    source = resolve_source(args.source)
    out = Path(args.out)
    fmt = output_format(out, args.format)
    check_new_output(out)
    G, info = load_generator(source.path, ema=not args.no_ema)
    args.label = resolve_label(args.label, source.run, info)  # a class name or an index -> the index
    num = _count(args, info)
    images, labels = sample_images(G, info, num, label=args.label, seed=args.seed)
    if fmt == "npz":
        write_new_file(out, npz_bytes(images, labels))
    elif fmt == "folder":
        write_new_folder(out, lambda folder: write_pngs(folder, images, labels))
    else:
        write_new_file(out, grid_bytes(images, info, args.label))
    what = f", class {args.label}" if args.label is not None else ", every class" if info["conditional"] else ""
    weights = "the EMA of G" if info["ema"] else "the raw G"
    print(f"wrote {out} ({len(images)} samples{what}, {weights} of step {info['step']}, seed {args.seed})")
    if args.no_ema and not info["has_ema"]:
        print(f"note: {source.path} kept no EMA of G: its samples always come from the raw G, so --no-ema changes "
              "nothing")
    return 0


def _count(args: argparse.Namespace, info: dict[str, Any]) -> int:
    classes = info["num_classes"]
    if not info["conditional"] or args.label is not None:
        return args.num or 64
    if args.num is None:
        return PER_CLASS * classes
    if args.num % classes:
        lower, upper = args.num - args.num % classes, args.num - args.num % classes + classes
        fix = f"--num {upper}" if lower == 0 else f"--num {lower} or {upper}"
        raise CommandError(f"--num {args.num} is not a multiple of the run's {classes} classes (the samples are shared "
                          f"equally between them): pass {fix}, or --label to sample one class")
    return args.num


def quantise(images: torch.Tensor) -> np.ndarray:
    """Images in [-1, 1] -> uint8 (N, H, W, C): ``clamp(round((x + 1) * 127.5), 0, 255)``."""
    pixels = images.detach().float().cpu().add(1).mul(127.5).round().clamp(0, 255).to(torch.uint8)
    return pixels.permute(0, 2, 3, 1).numpy()


def npz_bytes(images: torch.Tensor, labels: torch.Tensor | None) -> bytes:
    arrays = {"images": images.detach().float().cpu().numpy()}
    if labels is not None:
        arrays["labels"] = labels.numpy()
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def grid_bytes(images: torch.Tensor, info: dict[str, Any], label: int | None) -> bytes:
    """A PNG grid as :func:`gan_accel.pictures.save_grid` draws it."""
    from torchvision.utils import save_image

    from ..pictures.samples import to_grid

    # a conditional run: one row per class, or one class in rows of 10; otherwise a square grid
    if not info["conditional"]:
        columns = None
    else:
        columns = len(images) // info["num_classes"] if label is None else min(10, len(images))
    buffer = io.BytesIO()
    save_image(to_grid(images, columns), buffer, format="png")
    return buffer.getvalue()


def sample_file_names(count: int, labels: torch.Tensor | None) -> list[str]:
    """``000000.png``, ...; with labels ``000000_label3.png``: sorted by name, they keep the samples' order."""
    width = max(6, len(str(count - 1)))
    if labels is None:
        return [f"{i:0{width}d}.png" for i in range(count)]
    return [f"{i:0{width}d}_label{int(y)}.png" for i, y in enumerate(labels)]


def write_pngs(folder: Path, images: torch.Tensor, labels: torch.Tensor | None) -> None:
    from PIL import Image

    pixels = quantise(images)
    if pixels.shape[-1] not in (1, 3, 4):
        raise CommandError(f"samples with {pixels.shape[-1]} channels cannot be PNG files: use --format npz")
    for name, image in zip(sample_file_names(len(pixels), labels), pixels):
        Image.fromarray(image[..., 0] if pixels.shape[-1] == 1 else image).save(folder / name, format="png")
