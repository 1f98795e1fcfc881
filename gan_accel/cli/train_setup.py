"""What ``gan-accel train`` decides before training: the model family and resolution, the data, the run folder.

The default rules (docs/own-images.md says the same):

* **The model**: ``--model``, else ``dcgan`` up to 64 px and ``resnet`` above (a resolution only the
  residual family makes).
* **The resolution**: ``--resolution``, else the largest size the model makes that is at most the
  median short side of the readable images (the smallest size it makes when they are all smaller: they
  are upscaled). Without ``--model`` that is at most 64 px: a first run that finishes; ask for 128 or 256
  with ``--resolution`` (``resnet``) or with ``--model resnet``.
* **The channels**: ``--channels``, else 1 when every image is grayscale, else 3.
* **Resuming** (``--resume`` of the run's own checkpoints) takes the model family, the resolution and the
  channels the run recorded when they are not given, so the same command continues the same networks.

Every mistake is one line (:class:`~gan_accel.errors.ConfigError` / :class:`~gan_accel.errors.DataError`)
before anything is written into the run folder.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Callable

from ..callbacks import Callback
from ..collective import run_together
from ..data import ImageData, open_image_data
from ..data.image_survey import image_sizes, median_short_side
from ..errors import ConfigError, DataError
from ..models import FAMILIES, default_spec, supported_resolutions
from ..state.checkpoint import resolve_resume
from ..state.layout import CONFIG, read_json
from ..state.run_folder import check_new_run

DCGAN_LARGEST = max(supported_resolutions("dcgan"))


def default_output_dir(data: str) -> str:
    """``runs/<name>``: the data folder's or ZIP's name, or the Hugging Face dataset's (``hf:user/pets:train`` -> pets)."""
    text = str(data).rstrip("/\\")
    if text.startswith("hf:"):
        text = re.sub(r":[^/\\:]*$", "", text[3:]) if text.count(":") > 1 else text[3:]
    name = Path(text).stem or Path(text).resolve().name
    return f"runs/{name or 'images'}"


def recorded_spec(args: argparse.Namespace) -> dict[str, Any] | None:
    """The networks' spec the run in ``--output-dir`` recorded, when resuming it; else None."""
    if args.resume is None:
        return None
    try:
        spec = read_json(Path(args.output_dir) / CONFIG).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return spec if isinstance(spec, dict) and "family" in spec else None


def fill_from_run(args: argparse.Namespace) -> None:
    """On resume, ``--model``, ``--resolution`` and ``--channels`` left out are the run's own (see the module)."""
    spec = recorded_spec(args)
    if spec is None:
        return
    args.model = args.model or spec["family"]
    args.resolution = args.resolution or spec.get("image_size")
    args.channels = args.channels or spec.get("channels")


def family_of(args: argparse.Namespace) -> str:
    """``--model``, else dcgan up to 64 px and resnet above."""
    if args.model:
        return args.model
    return "resnet" if args.resolution and args.resolution > DCGAN_LARGEST else "dcgan"


def check_flags(args: argparse.Namespace, family: str) -> dict[str, Any]:
    """The model flags that fit ``family`` and the conditional switch, as spec keys; one line for one that does not."""
    if not args.conditional:
        for flag, value in (("--label-column", args.label_column), ("--label-distribution", args.label_distribution),
                            ("--class-weight", args.class_weight), ("--d-position", args.d_position)):
            if value is not None:
                raise ConfigError(f"{flag} is a setting of a class-conditional run: add --conditional (labels from "
                                  "class subfolders or a class column), or leave it out")
    overrides: dict[str, Any] = {}
    if args.width is not None:
        overrides["width"] = args.width
    if args.z_dim is not None:
        overrides["z_dim"] = args.z_dim
    if family == "dcgan":
        if args.spectral_norm:
            overrides["spectral_norm"] = True
        if args.d_position is not None:
            overrides["d_position"] = args.d_position
    elif args.spectral_norm:
        raise ConfigError("--spectral-norm: the resnet family's D is always spectrally normalised; leave the flag out")
    elif args.d_position is not None:
        raise ConfigError("--d-position sets the dcgan family's conditional D: leave it out with --model resnet")
    return overrides


def check_model(args: argparse.Namespace, family: str) -> dict[str, Any]:
    """Before the data: the flags fit the family and, when ``--resolution`` is given, the family makes it."""
    overrides = check_flags(args, family)
    if args.resolution is not None:
        default_spec(family, args.resolution, args.channels or 3, 2 if args.conditional else None, **overrides)
    return overrides


def z_dim_of(args: argparse.Namespace, family: str) -> int:
    return args.z_dim or FAMILIES[family].default_z_dim


def default_resolution(family: str, sizes: list[tuple[int, int]]) -> tuple[int, str]:
    """The resolution rule of the module docstring, and one line saying why."""
    made = supported_resolutions(family)
    side = median_short_side(sizes)
    if side is None:
        return made[0], ""
    fitting = [size for size in made if size <= side]
    chosen = fitting[-1] if fitting else made[0]
    why = "the largest" if fitting else "the smallest (the images are upscaled)"
    return chosen, (f"gan_accel: {chosen} px: {why} size the {family} family makes for images whose median short "
                    f"side is {side} px (choose with --resolution)")


def check_run_folder(args: argparse.Namespace) -> None:
    """Read-only, before the data is opened: a new run does not land on another; a resume names a checkpoint."""
    if args.resume is not None:
        resolve_resume(args.resume, args.output_dir)
    else:
        check_new_run(args.output_dir)


def open_data(args: argparse.Namespace, family: str, accelerator: Any, log: Callable[[str], Any]) -> ImageData:
    """Scan (choosing the resolution when it is not given) and open the data: one line for any mistake in it."""
    labels = "required" if args.conditional else "none"
    common = dict(split=args.split, image_column=args.image_column, label_column=args.label_column,
                  cache_dir=args.cache_dir, accelerator=accelerator)
    resolution = args.resolution
    if resolution is None:
        resolution, why = default_resolution(family, image_sizes(args.data, labels=labels, **common))
        if why:
            log(why)
    data = open_image_data(args.data, resolution, args.channels, args.crop, labels, background=args.background,
                           batch_size=args.batch_size, log=log, **common)
    if args.conditional and len(data.class_names or []) < 2:
        raise DataError(f"a conditional run needs at least 2 classes, and {data.report.source} has "
                        f"{len(data.class_names or [])}: add classes, or train unconditionally")
    return data


def model_spec(args: argparse.Namespace, family: str, data: ImageData) -> dict[str, Any]:
    """The complete spec of the networks for this data (what the run records in ``config.model``)."""
    num_classes = len(data.class_names) if args.conditional else None
    return default_spec(family, data.resolution, data.channels, num_classes, **check_flags(args, family))


def data_extra(data: ImageData) -> dict[str, Any]:
    """What the run's config records about its data (``config.extra``)."""
    return {"dataset": Path(data.report.source).name or data.report.source, "data_source": data.report.source,
            "data_fingerprint": data.fingerprint, "images": len(data),
            "classes": len(data.class_names) if data.class_names else None, "channels": data.channels,
            "resolution": data.resolution, "crop": data.crop}


class RunDataFiles(Callback):
    """Writes the data's files into the run folder as training starts (``data.json``, ``class_names.json``,
    ``skipped_files.txt``: :meth:`ImageData.write_run_files`)."""

    def __init__(self, data: ImageData) -> None:
        self.data = data

    def on_fit_start(self, trainer: Any) -> None:
        run_together(trainer.accelerator, lambda: self.data.write_run_files(trainer.output_dir), main_only=True)
