"""``export_generator``: a run's generator as a folder Hugging Face users recognise.

    export_generator("runs/photos", "photos_gan")
    photos_gan/
      config.json         everything needed to rebuild G: the networks' spec, the class names, what the
                          weights are (EMA or raw, step), the latent and output shapes, the training config,
                          the data summary and the scores (paths on your machine cut to their last part)
      model.safetensors   G's weights (the EMA when the run kept one)
      README.md           the model card (card.py)
      samples.png         a grid of samples (a conditional G: one row per class, at most 16 rows)

The folder is written beside its final name and renamed into place when complete; an existing
folder is never replaced.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file
from torch import nn

from ..errors import GanAccelError
from ..models import normalize_spec
from ..sampling import load_generator as load_run_generator
from ..state.checkpoint import is_complete
from ..state.files import temporary_name
from ..state.layout import (BEST, CLASS_NAMES, DATA_RECORD, EVAL, EXPORT_CARD, EXPORT_CONFIG, EXPORT_SAMPLES,
                            EXPORT_WEIGHTS, checkpoint_run_folder, read_json)
from .card import model_card

FORMAT = "gan_accel.generator"
FORMAT_VERSION = 1
GRID_ROWS = 16  # classes shown in a conditional G's sample grid
PER_CLASS = 8


class ExportError(GanAccelError, ValueError):
    """An export cannot be written, read or shared as asked; the message says the fix."""


def _read_optional(path: Path) -> Any:
    """A JSON file of the run, or None when it is missing or unreadable (an export never fails for it)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def public_path(text: Any) -> Any:
    """A path on this machine cut to its last part (what an export records of local paths); other text as is."""
    if not isinstance(text, str) or not text:
        return text
    if text.startswith("imagefolder "):
        return "imagefolder " + public_path(text[len("imagefolder "):])
    looks_local = os.path.isabs(text) or text.startswith(("~", ".")) or ("/" in text and os.path.exists(text))
    return (Path(text).name or text) if looks_local else text


def class_names_of(run: Path, num_classes: int | None) -> list[str] | None:
    """The class names a run kept (``class_names.json``), when they fit its number of classes."""
    names = _read_optional(run / CLASS_NAMES)
    if num_classes is None or not isinstance(names, list) or len(names) != num_classes:
        return None
    return [str(name) for name in names]


def export_config(info: dict[str, Any], run: Path) -> dict[str, Any]:
    """The export's ``config.json`` (see the module docstring) from :func:`gan_accel.sampling.load_generator`'s info."""
    import gan_accel

    spec = normalize_spec(info["config"]["model"])
    training = dict(info["config"])
    training["output_dir"] = public_path(str(training.get("output_dir", "")))
    extra = dict(training.get("extra") or {})
    if "data_source" in extra:
        extra["data_source"] = public_path(extra["data_source"])
    training["extra"] = extra
    data = _read_optional(run / DATA_RECORD)
    if isinstance(data, dict):
        data = {**data, "source": public_path(data.get("source"))}
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gan_accel_version": gan_accel.__version__,
        "model": spec, "class_names": class_names_of(run, spec["num_classes"]),
        "weights": {"file": EXPORT_WEIGHTS, "ema": bool(info["ema"]), "has_ema": bool(info["has_ema"]),
                    "step": info["step"], "dtype": "float32"},
        "latent": {"distribution": "standard normal", "shape": [spec["z_dim"]]},
        "output": {"shape": [spec["channels"], spec["image_size"], spec["image_size"]], "range": [-1, 1]},
        "training": training, "data": data if isinstance(data, dict) else None,
        "scores": {"best": _read_optional(run / BEST), "eval": _read_optional(run / EVAL)},
    }


@torch.no_grad()
def sample_grid(G: nn.Module, spec: dict[str, Any], num: int = 64, seed: int = 0) -> bytes:
    """A PNG grid of samples: ``num`` of them, or in a conditional G 8 per class for the first 16 classes."""
    from torchvision.utils import save_image

    from ..pictures.samples import to_grid

    generator = torch.Generator().manual_seed(seed)
    if spec["num_classes"] is None:
        images, rows = G(torch.randn(num, spec["z_dim"], generator=generator)), None
    else:
        labels = torch.arange(min(spec["num_classes"], GRID_ROWS)).repeat_interleave(PER_CLASS)
        images, rows = G(torch.randn(len(labels), spec["z_dim"], generator=generator), labels), PER_CLASS
    buffer = io.BytesIO()
    save_image(to_grid(images, rows), buffer, format="png")
    return buffer.getvalue()


def write_new_folder(out: Path, fill: Callable[[Path], None]) -> None:
    """Create ``out`` with what ``fill(folder)`` writes, complete or not at all; an existing ``out`` is an error.

    The name is claimed first (``mkdir``), the files go to a temporary folder beside it, which then
    replaces the claimed empty folder in one rename.
    """
    try:
        out.mkdir()
    except FileExistsError:
        raise ExportError(f"{out} exists, and gan-accel never replaces anything: choose a new folder") from None
    except OSError as error:
        raise ExportError(f"cannot create {out}: {error.strerror or error}; choose a folder you can write in") from None
    tmp = temporary_name(out)
    try:
        tmp.mkdir()
        fill(tmp)
        os.rename(tmp, out)  # replaces only the empty folder claimed above
    except BaseException:
        if tmp.is_dir():
            for file in tmp.iterdir():
                file.unlink()
            tmp.rmdir()
        out.rmdir()
        raise


def export_generator(source: str | os.PathLike, out_dir: str | os.PathLike, *, ema: bool = True, num_samples: int = 64,
                     seed: int = 0, license: str | None = None, repo_id: str | None = None) -> Path:
    """Write the export folder ``out_dir`` (see the module docstring) of a run folder or a checkpoint.

    ``ema=False`` exports the raw G instead of its EMA. ``num_samples`` and ``seed`` make the card's
    grid. ``license`` goes into the card's metadata; ``repo_id`` is the Hub name the card's snippet
    loads (default: ``out_dir``). Returns ``out_dir``.
    """
    source, out = Path(source), Path(out_dir)
    G, info = load_run_generator(source, ema=ema)
    run = checkpoint_run_folder(source) if is_complete(source) else source
    config = export_config(info, run)
    grid = sample_grid(G, config["model"], num_samples, seed)
    parameters = sum(p.numel() for p in G.parameters())
    card = model_card(config, repo_id or str(out_dir), parameters, license)
    state = {key: value.detach().contiguous().cpu() for key, value in G.state_dict().items()}

    def fill(folder: Path) -> None:
        save_file(state, str(folder / EXPORT_WEIGHTS), metadata={"format": "pt"})
        (folder / EXPORT_CONFIG).write_text(json.dumps(config, indent=2, default=str) + "\n")
        (folder / EXPORT_CARD).write_text(card)
        (folder / EXPORT_SAMPLES).write_bytes(grid)

    write_new_folder(out, fill)
    return out
