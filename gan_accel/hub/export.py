"""``export_generator``: a run's generator folder (:mod:`gan_accel.storage.weights`) with its model card
(``README.md``) and ``samples.png`` (a conditional G: one row per class, at most 16), as a new folder the
Hugging Face Hub shows. It is written beside its final name and renamed into place; nothing is replaced.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import GanAccelError
from ..storage.checkpoint import is_complete
from ..storage.files import write_new_folder
from ..storage.layout import EXPORT_CARD, EXPORT_SAMPLES, checkpoint_run_folder
from ..storage.weights import save_generator, scores_of
from .card import check_license, model_card

GRID_ROWS = 16  # classes shown in a conditional G's sample grid
PER_CLASS = 8


class ExportError(GanAccelError, ValueError):
    """A generator folder cannot be written, read or shared as asked; the message says the fix."""


def png_grid(images: torch.Tensor, columns: int | None) -> bytes:
    """A PNG grid as :func:`gan_accel.pictures.save_grid` draws it (``columns`` per row; None: square)."""
    from torchvision.utils import save_image

    from ..pictures.grids import to_grid

    buffer = io.BytesIO()
    save_image(to_grid(images, columns), buffer, format="png")
    return buffer.getvalue()


@torch.no_grad()
def sample_grid(G: nn.Module, spec: dict[str, Any], num: int = 64, seed: int = 0) -> bytes:
    """A PNG grid of samples: ``num`` of them, or in a conditional G 8 per class for the first 16 classes."""
    generator = torch.Generator().manual_seed(seed)
    if spec["num_classes"] is None:
        images, rows = G(torch.randn(num, spec["z_dim"], generator=generator)), None
    else:
        labels = torch.arange(min(spec["num_classes"], GRID_ROWS)).repeat_interleave(PER_CLASS)
        images, rows = G(torch.randn(len(labels), spec["z_dim"], generator=generator), labels), PER_CLASS
    return png_grid(images, rows)


def export_generator(source: str | os.PathLike, out_dir: str | os.PathLike, *, ema: bool = True, num_samples: int = 64,
                     seed: int = 0, license: str | None = None, repo_id: str | None = None) -> Path:
    """Write the new folder ``out_dir``: the generator of a run or a checkpoint with its model card and grid.

    ``ema=False``: the raw G. ``num_samples``, ``seed``: the card's grid. ``license``: the card's metadata.
    ``repo_id``: what the card's snippet loads (default: the folder's name, as loaded from beside it; never a
    path of this machine). Returns ``out_dir``.
    """
    from .load import load_generator

    check_license(license)
    source, out = Path(source), Path(out_dir)
    G = load_generator(source, ema=ema)
    run = checkpoint_run_folder(source) if is_complete(source) else source
    config = {**G.info, "scores": scores_of(run)}  # evaluations written after the run's end count too
    grid = sample_grid(G, config["model"], num_samples, seed)
    # The folder's name, not its path: a card is shared, and this machine's folders are no one else's business.
    card = model_card(config, repo_id or out.name, sum(p.numel() for p in G.parameters()), license)

    def fill(folder: Path) -> None:
        save_generator(folder, G, config)
        (folder / EXPORT_CARD).write_text(card)
        (folder / EXPORT_SAMPLES).write_bytes(grid)

    write_new_folder(out, fill, flag="DIR")
    return out
