"""``gan-accel sample RUN_OR_CHECKPOINT --out PATH``: samples of a run's generator as a grid, arrays or PNG files.

* ``--format png``: one grid (a conditional run: one row per class, or one class in rows of 10).
* ``--format npz``: ``images`` (N, C, H, W) float32 in [-1, 1] and, for a conditional run, ``labels``.
* ``--format folder``: a new folder of one PNG per sample (``000000.png``, or ``000000_label3.png``
  in a conditional run), quantised as ``round((x + 1) * 127.5)``: what FID tools read.

``--interpolate``: a grid of latent walks instead (``--walks`` rows of ``--steps`` images, each row a spherical
interpolation between two Gaussian latents; a conditional run: one row per class, or ``--label``'s class), and
with ``--gif PATH`` also an animated GIF whose frame ``j`` shows every walk at its ``j``-th step.

``--seeds 0-35,40``: one image per seed instead (NVlabs' gen_images.py), by default as a new folder of
``seed0000.png`` ..., seed ``s`` being the latent :mod:`gan_accel.sampling` defines (the image ``--num 1 --seed s``
gives). ``--trunc PSI``: the truncation trick, every latent moved towards the mean latent (psi 1: unchanged).

Without ``--format`` the format follows the ending of ``--out`` (``.png`` or ``.npz``; with ``--seeds`` a name
without either is a folder). The same ``--seed`` gives the same latents, hence the same bytes. ``--no-ema``
samples the raw G rather than its EMA (from a run folder: the raw G of the checkpoint written at the run's last step).
"""

from __future__ import annotations

import argparse
import io
import zipfile
from itertools import chain, groupby
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np
import torch

from ..hub import load_generator
from ..pictures.grids import png_grid, write_gif
from ..sampling import (MAX_SAMPLES, MAX_STEPS, MAX_WALKS, check_sample_request, check_seeds, classes_of, interpolate,
                        iter_samples, sample_count, sample_labels, walk_count)
from ..storage.files import write_new_folder
from ..text import printable
from .aliases import SAMPLING
from .arguments import bounded_int, finite_float, seed_int, seed_ranges
from .common import CommandError, check_new_output, resolve_source, write_new_file, write_new_file_with
from .labels import label_argument, label_name, resolve_label

FORMATS = ("png", "npz", "folder")
SUFFIXES = {".png": "png", ".npz": "npz"}
PER_CLASS = 8  # default samples per class of a conditional run without --label
MAX_GRID_VALUES = 64 * 2**20  # a PNG grid is made in memory: at most this many sample values (256 MB in float32)
MAX_GRID_SAMPLES = 10_000  # and at most this many samples (a 100 x 100 grid)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "sample", help="write samples of a run's generator: a PNG grid, an .npz of arrays, or a folder of PNGs",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                        help="a finished run folder (its generator/) or a checkpoints/checkpoint_<step> folder")
    parser.add_argument("--out", required=True, help="a new file (.png, .npz) or, with --format folder, a new folder; "
                        "nothing existing is ever replaced")
    parser.add_argument("--num", type=bounded_int(1, MAX_SAMPLES), default=None,
                        help=f"how many samples (default 64; a conditional run without --label: {PER_CLASS} per class, "
                             "and a multiple of the number of classes); npz and folder stream any number, a png grid "
                             f"holds at most {MAX_GRID_SAMPLES:,}")
    parser.add_argument("--seed", type=seed_int, default=0, help="the latents' seed: the same seed, the same "
                        "samples (default 0)")
    parser.add_argument("--seeds", type=seed_ranges, default=None, metavar="LIST",
                        help="one image per seed, e.g. 0-35,40 (ranges include both ends); seed s is the image "
                             "--num 1 --seed s gives; with --out NAME (no .png/.npz) a new folder of seed0000.png ...")
    parser.add_argument("--trunc", type=finite_float, default=1.0, metavar="PSI",
                        help="the truncation trick: each latent moved towards the mean latent, mean + PSI * (z - mean) "
                             "(the mean is 0: no gan_accel G has a mapping network); 1 (the default) changes nothing, "
                             "below 1 the samples vary less and fade towards the average image (docs/cli.md)")
    parser.add_argument("--label", type=label_argument, default=None, metavar="NAME_OR_INDEX",
                        help="a conditional run: sample this class only, by its name (class_names.json) or index "
                             "(default: every class, in equal numbers)")
    parser.add_argument("--no-ema", action="store_true",
                        help="sample the raw G instead of its EMA (a run without an EMA samples its raw G anyway)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="png: a grid; npz: arrays 'images' (N, C, H, W) in [-1, 1] and 'labels'; folder: one PNG "
                             "per sample (default: from the ending of --out)")
    walks = parser.add_argument_group("latent walks")
    walks.add_argument("--interpolate", action="store_true", help="write a PNG grid of latent walks (slerp between "
                       "Gaussian latents): one walk per row, one step per column")
    walks.add_argument("--walks", type=bounded_int(1, MAX_WALKS), default=None,
                       help="--interpolate: how many walks (rows; default 8, a conditional run without --label: one "
                            "per class)")
    walks.add_argument("--steps", type=bounded_int(2, MAX_STEPS), default=None,
                       help="--interpolate: images per walk, both ends included (columns; default 10)")
    walks.add_argument("--gif", default=None, metavar="PATH",
                       help="--interpolate: also write this new .gif, frame j showing every walk at its j-th step")
    parser.read_aliases(SAMPLING)
    parser.set_defaults(run=run)


def output_format(out: Path, chosen: str | None, seeds: bool = False) -> str:
    """The format: ``--format``, or the ending of ``--out`` (with ``--seeds``, a name without .png or .npz is a
    folder, as NVlabs' --outdir); a contradiction between them is an error."""
    implied = SUFFIXES.get(out.suffix.lower())
    if chosen is None and seeds and implied is None:
        return "folder"
    if chosen is None:
        if implied is None:
            raise CommandError(f"--out {out}: cannot tell the format from its ending; end it in .png (a grid) or .npz "
                              "(arrays), or pass --format png|npz|folder (folder: one PNG per sample)")
        return implied
    if implied is not None and implied != chosen:
        raise CommandError(f"--out {out} ends in {out.suffix} but --format is {chosen}: make them agree (e.g. "
                          f"--out {out.with_suffix('') if chosen == 'folder' else out.with_suffix('.' + chosen)})")
    return chosen


def run(args: argparse.Namespace) -> int:
    source = resolve_source(args.source)
    out = Path(args.out)
    fmt = output_format(out, args.format, seeds=args.seeds is not None)
    _check_walk_flags(args, fmt)
    _check_seed_flags(args)
    check_new_output(out)
    if args.gif is not None:
        check_new_output(Path(args.gif), "--gif")
    G = load_generator(source, ema=not args.no_ema)
    classes, weights = classes_of(G), G.info["weights"]
    args.label = resolve_label(args.label, G)  # a class name or an index -> the index
    if args.interpolate:
        return _walks(args, G, out)
    if args.seeds is not None:
        check_seeds(args.seeds, classes, args.label)
        num = count = len(args.seeds)
    else:
        num = _count(args, classes)
        check_sample_request(classes, num, args.label)
        count = sample_count(classes, num, args.label)
    if fmt == "png":
        _check_grid(count, G.info["model"])
    # The samples are made chunk by chunk and written as they come (npz, folder): memory does not grow with --num.
    chunks = iter_samples(G, num, label=args.label, seed=args.seed, seeds=args.seeds, truncation=args.trunc)
    if fmt == "npz":
        write_new_file_with(out, lambda handle: write_npz(handle, chunks, count,
                                                          lambda a, b: sample_labels(classes, num, args.label, a, b)))
    elif fmt == "folder":
        names = None if args.seeds is None else [f"seed{seed:04d}.png" for seed in args.seeds]  # NVlabs' names
        write_new_folder(out, lambda folder: write_pngs(folder, chunks, count, names))
    else:
        images = torch.cat([images for images, _ in chunks])
        # a conditional run: one row per class, or one class in rows of 10; otherwise a square grid
        columns = None if classes is None else len(images) // classes if args.label is None else min(10, len(images))
        write_new_file(out, png_grid(images, columns))
    what = f", {label_name(args.label, G)}" if args.label is not None else ", every class" if classes is not None else ""
    kind = "the EMA of G" if weights["ema"] else "the raw G"
    seeds = f"seeds {describe_seeds(args.seeds)}" if args.seeds is not None else f"seed {args.seed}"
    trunc = f", truncation psi {args.trunc:g}" if args.trunc != 1.0 else ""
    print(f"wrote {out} ({count} samples{what}, {kind} of step {printable(str(weights['step']))}, {seeds}{trunc})")
    if args.no_ema and not weights["has_ema"]:
        print(f"note: {source} kept no EMA of G: its samples always come from the raw G, so --no-ema changes "
              "nothing")
    return 0


def _check_walk_flags(args: argparse.Namespace, fmt: str) -> None:
    """The latent-walk flags go together: refused in one line before G is loaded."""
    if not args.interpolate:
        given = [flag for flag, value in (("--walks", args.walks), ("--steps", args.steps),
                                          ("--gif", args.gif)) if value is not None]
        if given:
            raise CommandError(f"{given[0]} is an option of latent walks: add --interpolate (or leave it out)")
        return
    if args.num is not None:
        raise CommandError("--num counts plain samples: with --interpolate the grid holds --walks x --steps images")
    if fmt != "png":
        raise CommandError(f"--interpolate writes a PNG grid, not {fmt}: end --out in .png")
    if args.gif is not None and Path(args.gif).suffix.lower() != ".gif":
        raise CommandError(f"--gif {args.gif}: the animation is a GIF; give a path ending in .gif")
    if args.gif is not None and Path(args.gif).absolute() == Path(args.out).absolute():
        raise CommandError(f"--gif and --out are both {args.out}: give the grid and the GIF a file each")


def _check_seed_flags(args: argparse.Namespace) -> None:
    """``--seeds`` names every latent: ``--num``, ``--seed`` and ``--interpolate`` are refused beside it."""
    if args.seeds is None:
        return
    for flag, given in (("--num", args.num is not None), ("--seed", args.seed != 0),
                        ("--interpolate", args.interpolate)):
        if given:
            raise CommandError(f"--seeds gives one image per seed listed: leave out {flag} (or --seeds)")


def describe_seeds(seeds: list[int]) -> str:
    """``0-35,40``: the seeds as ranges, in their order."""
    # consecutive seeds keep seed - position constant: each such group is one range
    runs = [[seed for _, seed in run] for _, run in groupby(enumerate(seeds), lambda item: item[1] - item[0])]
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def _walks(args: argparse.Namespace, G: torch.nn.Module, out: Path) -> int:
    """``--interpolate``: the grid of latent walks (and with ``--gif`` its animation), as new files."""
    classes, weights, steps = classes_of(G), G.info["weights"], args.steps or 10
    walks = walk_count(classes, args.walks, args.label)
    _check_grid(walks * steps, G.info["model"])
    images = interpolate(G, walks, steps, label=args.label, seed=args.seed, truncation=args.trunc)
    write_new_file(out, png_grid(images, steps))
    what = f", class {args.label}" if args.label is not None else ", walk i in class i mod classes" if classes else ""
    kind = "the EMA of G" if weights["ema"] else "the raw G"
    print(f"wrote {out} ({walks} walks x {steps} steps of slerp{what}, {kind} of step "
          f"{printable(str(weights['step']))}, seed {args.seed})")
    if args.gif is not None:
        rows = images.reshape(walks, steps, *images.shape[1:])
        frames = [io.BytesIO(png_grid(rows[:, j], None)) for j in range(steps)]
        write_new_file_with(Path(args.gif), lambda handle: write_gif(handle, frames), "--gif")
        print(f"wrote {args.gif} ({steps} frames: every walk at each step)")
    return 0


def _check_grid(count: int, model: dict[str, Any]) -> None:
    """A PNG grid is drawn in memory: refuse one too large, in one line, before any sample is made."""
    size, channels = model.get("image_size"), model.get("channels")
    values = count * channels * size * size if isinstance(size, int) and isinstance(channels, int) else 0
    if count > MAX_GRID_SAMPLES or values > MAX_GRID_VALUES:
        raise CommandError(f"--num {count}: a PNG grid of {count:,} samples is drawn in memory and holds at most "
                           f"{MAX_GRID_SAMPLES:,} samples ({MAX_GRID_VALUES:,} values; these are {channels}x{size}x{size}); "
                           "use --format folder (one PNG per sample) or an .npz, which stream any --num")


def _count(args: argparse.Namespace, classes: int | None) -> int:
    if classes is None or args.label is not None:
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


def write_npz(handle: IO[bytes], chunks: Iterator[tuple[torch.Tensor, torch.Tensor | None]], count: int,
              labels_of: Any) -> None:
    """An .npz as ``np.savez`` writes it (``images`` float32 (N, C, H, W), ``labels`` int64 for a conditional run),
    written chunk by chunk: the arrays are never whole in memory. ``labels_of(start, stop)`` gives the labels
    again for the second array. The members' dates are fixed, so the same samples give the same bytes."""
    first, first_labels = next(chunks)
    images = chain([first], (images for images, _ in chunks))
    with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        _write_member(archive, "images.npy", np.float32, (count, *first.shape[1:]),
                      (part.detach().float().cpu().numpy() for part in images))
        if first_labels is not None:
            _write_member(archive, "labels.npy", np.int64, (count,),
                          (labels_of(a, min(a + 65_536, count)).numpy() for a in range(0, count, 65_536)))


def _write_member(archive: zipfile.ZipFile, name: str, dtype: Any, shape: tuple[int, ...], parts: Iterator[Any]) -> None:
    """One ``.npy`` member of an archive: the header for ``shape``, then the parts' bytes in order."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    with archive.open(info, "w", force_zip64=True) as member:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(member, header)
        written = 0
        for part in parts:
            member.write(np.ascontiguousarray(part, dtype=dtype).tobytes())
            written += len(part)
        if written != shape[0]:
            raise RuntimeError(f"{name}: {written} rows written for {shape[0]}")  # a bug, not a user's mistake


def sample_file_name(index: int, count: int, label: Any = None) -> str:
    """``000000.png``, ...; with a label ``000000_label3.png``: sorted by name, they keep the samples' order."""
    width = max(6, len(str(count - 1)))
    return f"{index:0{width}d}.png" if label is None else f"{index:0{width}d}_label{int(label)}.png"


def write_pngs(folder: Path, chunks: Iterator[tuple[torch.Tensor, torch.Tensor | None]], count: int,
               names: list[str] | None = None) -> None:
    """One PNG per sample, chunk by chunk as they are made (named ``names``, else by index)."""
    from PIL import Image

    index = 0
    for images, labels in chunks:
        pixels = quantise(images)
        if pixels.shape[-1] not in (1, 3, 4):
            raise CommandError(f"samples with {pixels.shape[-1]} channels cannot be PNG files: use --format npz")
        for i, image in enumerate(pixels):
            name = names[index] if names is not None else \
                sample_file_name(index, count, None if labels is None else labels[i])
            Image.fromarray(image[..., 0] if pixels.shape[-1] == 1 else image).save(folder / name, format="png")
            index += 1
