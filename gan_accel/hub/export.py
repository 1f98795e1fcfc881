"""``export_generator``: a run's generator as a new folder the Hugging Face Hub shows, written by
``G.save_pretrained`` (:mod:`gan_accel.hub.pretrained`): ``config.json``, ``model.safetensors``, the model card
(``README.md``) and ``samples.png`` (a conditional G: one row per class, at most 16). It is written beside its
final name and renamed into place; nothing is replaced.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ExportError
from ..storage.checkpoint import is_complete
from ..storage.files import write_new_folder
from ..storage.layout import checkpoint_run_folder
from ..storage.weights import scores_of
from .card import check_license
from .pretrained import load_generator

__all__ = ["ExportError", "export_generator"]


def export_generator(source: str | os.PathLike, out_dir: str | os.PathLike, *, ema: bool = True, num_samples: int = 64,
                     seed: int = 0, license: str | None = None, repo_id: str | None = None) -> Path:
    """Write the new folder ``out_dir``: the generator of a run or a checkpoint with its model card and grid.

    ``ema=False``: the raw G. ``num_samples``, ``seed``: the card's grid. ``license``: the card's metadata.
    ``repo_id``: what the card's snippet loads (default: the folder's name, as loaded from beside it; never a
    path of this machine). Returns ``out_dir``.
    """
    check_license(license)
    source, out = Path(source), Path(out_dir)
    G = load_generator(source, ema=ema)
    run = checkpoint_run_folder(source) if is_complete(source) else source
    G.info = {**G.info, "scores": scores_of(run)}  # evaluations written after the run's end count too
    G.grid_samples, G.grid_seed = num_samples, seed
    card = {"repo_id": repo_id or out.name, "license": license}
    write_new_folder(out, lambda folder: G.save_pretrained(folder, model_card_kwargs=card), flag="DIR")
    return out
