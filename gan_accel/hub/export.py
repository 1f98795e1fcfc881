"""The one generator format, written: what a run leaves in ``<run>/generator/`` and ``gan-accel export``
copies, with the model card added::

    photos_gan/
      config.json         everything needed to rebuild G: the networks' spec, the class names, what the
                          weights are (EMA or raw, step), the latent and output shapes, the training config,
                          the data summary and the scores (paths on your machine cut to their last part)
      model.safetensors   G's weights (the EMA when the run kept one)
      README.md           the model card (card.py), export only
      samples.png         a grid of samples (a conditional G: one row per class, at most 16 rows), export only

An export is written beside its final name and renamed into place when complete; an existing folder is
never replaced.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..errors import GanAccelError
from ..models import normalize_spec
from ..state.checkpoint import is_complete
from ..state.files import atomic_path
from ..state.layout import (BEST, CLASS_NAMES, DATA_RECORD, EVAL, EXPORT_CARD, EXPORT_CONFIG, EXPORT_SAMPLES,
                            EXPORT_WEIGHTS, checkpoint_run_folder, read_json)
from .card import model_card

FORMAT = "gan_accel.generator"
FORMAT_VERSION = 1
GRID_ROWS = 16  # classes shown in a conditional G's sample grid
PER_CLASS = 8


class ExportError(GanAccelError, ValueError):
    """A generator folder cannot be written, read or shared as asked; the message says the fix."""


def _read_optional(path: Path) -> Any:
    """A JSON file of the run, or None when it is missing or unreadable (writing G never fails for it)."""
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


def scores_of(run: Path) -> dict[str, Any]:
    """The run's recorded evaluations (``best.json``, ``eval.json``), None where absent."""
    return {"best": _read_optional(run / BEST), "eval": _read_optional(run / EVAL)}


def generator_config(config: dict[str, Any], step: Any, ema: bool, has_ema: bool, run: Path) -> dict[str, Any]:
    """The ``config.json`` of the format (see the module docstring) for G of a run whose config is ``config``."""
    import gan_accel

    spec = normalize_spec(config["model"]) if isinstance(config.get("model"), dict) else None
    training = dict(config)
    training["output_dir"] = public_path(str(training.get("output_dir", "")))
    extra = dict(training.get("extra") or {})
    if "data_source" in extra:
        extra["data_source"] = public_path(extra["data_source"])
    training["extra"] = extra
    data = _read_optional(run / DATA_RECORD)
    if isinstance(data, dict):
        data = {**data, "source": public_path(data.get("source"))}
    names = _read_optional(run / CLASS_NAMES)
    num_classes = spec["num_classes"] if spec else None
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gan_accel_version": gan_accel.__version__,
        "model": spec,
        "class_names": [str(n) for n in names] if isinstance(names, list) and len(names) == num_classes else None,
        "weights": {"file": EXPORT_WEIGHTS, "ema": bool(ema), "has_ema": bool(has_ema), "step": step,
                    "dtype": "float32"},
        "latent": {"distribution": "standard normal", "shape": [spec["z_dim"]]} if spec else None,
        "output": {"shape": [spec["channels"], spec["image_size"], spec["image_size"]], "range": [-1, 1]}
        if spec else None,
        "training": training, "data": data if isinstance(data, dict) else None, "scores": scores_of(run),
    }


def save_generator(folder: Path, G: nn.Module, config: dict[str, Any]) -> None:
    """Write ``model.safetensors`` (G's weights) and then ``config.json`` into ``folder``, each file atomically."""
    state = {key: value.detach().contiguous().cpu() for key, value in G.state_dict().items()}
    folder.mkdir(exist_ok=True)
    with atomic_path(folder / EXPORT_WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    with atomic_path(folder / EXPORT_CONFIG) as tmp:
        tmp.write_text(json.dumps(config, indent=2, default=str) + "\n")


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


def export_generator(source: str | os.PathLike, out_dir: str | os.PathLike, *, ema: bool = True, num_samples: int = 64,
                     seed: int = 0, license: str | None = None, repo_id: str | None = None) -> Path:
    """Write the new folder ``out_dir``: the generator of a run or a checkpoint (see the module docstring) with
    its model card and sample grid.

    ``ema=False`` exports the raw G instead of its EMA. ``num_samples`` and ``seed`` make the card's
    grid. ``license`` goes into the card's metadata; ``repo_id`` is the Hub name the card's snippet
    loads (default: ``out_dir``). Returns ``out_dir``.
    """
    from ..cli.common import write_new_folder  # here: gan_accel.cli imports this package
    from .load import load_generator

    source, out = Path(source), Path(out_dir)
    G = load_generator(source, ema=ema)
    run = checkpoint_run_folder(source) if is_complete(source) else source
    config = {**G.info, "scores": scores_of(run)}  # evaluations written after the run's end count too
    grid = sample_grid(G, config["model"], num_samples, seed)
    card = model_card(config, repo_id or str(out_dir), sum(p.numel() for p in G.parameters()), license)

    def fill(folder: Path) -> None:
        save_generator(folder, G, config)
        (folder / EXPORT_CARD).write_text(card)
        (folder / EXPORT_SAMPLES).write_bytes(grid)

    write_new_folder(out, fill, flag="DIR")
    return out
