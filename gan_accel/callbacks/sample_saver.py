"""Progress samples from the fixed latents: ``samples_<step>.png`` grids of images or scatter plots of 2-D
points (``.pt`` for other samples), and at the end ``samples_final.png`` and ``progress.gif``.

``gif_frames`` caps the GIF's frames, evenly spaced over the run; ``keep_samples`` prunes step-stamped files
older than the newest K, except the GIF's frames: a run's only deletions besides its own pruned checkpoints.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import torch

from ..pictures.grids import is_image_batch, is_point_batch, save_gif, save_grid, save_scatter
from ..storage.files import atomic_path
from ..storage.layout import PROGRESS_GIF, samples_stem
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

KINDS = ("auto", "grid", "scatter", "tensor")
_STAMPED = re.compile(r"samples_(\d+)\.(png|pt)")


def gif_steps(steps: Iterable[int], frames: int) -> list[int]:
    """At most ``frames`` of ``steps``: for each of ``frames`` evenly spaced targets the nearest step (the lower on
    a tie), each once. A subset holding every chosen step gives the same steps, so pruning keeps the frames."""
    steps = sorted(set(steps))
    if len(steps) <= frames:
        return steps

    def nearest(target: float) -> int:
        at = bisect.bisect_left(steps, target)
        return min(steps[max(0, at - 1):at + 1], key=lambda step: (abs(step - target), step))

    return _spread(steps[0], steps[-1], frames, nearest)


def scheduled_gif_steps(sample_every: int, max_steps: int, frames: int) -> set[int] | None:
    """The steps :func:`gif_steps` chooses from a run's whole sampling schedule, without listing it; None when
    the schedule has ``frames`` steps or fewer."""
    last_multiple = max_steps // sample_every
    if last_multiple + (1 if max_steps % sample_every else 0) <= frames:
        return None

    def nearest(target: float) -> int:
        k = target / sample_every
        candidates = {min(max(math.floor(k), 1), last_multiple) * sample_every,
                      min(max(math.ceil(k), 1), last_multiple) * sample_every, max_steps}
        return min(candidates, key=lambda step: (abs(step - target), step))

    return set(_spread(sample_every, max_steps, frames, nearest))


def _spread(first: int, last: int, frames: int, nearest: Callable[[float], int]) -> list[int]:
    if frames == 1:
        return [last]
    steps = (nearest(first + (last - first) * index / (frames - 1)) for index in range(frames))
    return [step for step, _ in itertools.groupby(steps)]  # a step nearest to several targets, once


def stamped_samples(folder: Path) -> dict[int, list[Path]]:
    """The step-stamped sample files of a run folder (``samples_<step>.png`` / ``.pt``), by step."""
    found: dict[int, list[Path]] = {}
    for path in folder.glob("samples_*"):
        match = _STAMPED.fullmatch(path.name)
        if match and path.is_file() and not path.is_symlink():
            found.setdefault(int(match.group(1)), []).append(path)
    return found


class SampleSaver(Callback):
    """Writes samples of the sampling generator (the EMA when enabled) on ``on_sample`` and at the end; ``kind``
    ``"auto"`` chooses by the samples' shape, ``"grid"``, ``"scatter"`` or ``"tensor"`` force one."""

    def __init__(self, kind: str = "auto") -> None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
        self.kind = kind

    def on_sample(self, trainer: "GANTrainer") -> None:
        if trainer.accelerator.is_main_process:
            self.write(trainer, samples_stem(trainer.step))
            self.prune(trainer)

    def on_fit_end(self, trainer: "GANTrainer") -> None:
        if not trainer.accelerator.is_main_process:
            return
        final = self.write(trainer, samples_stem(None))
        grids = {step: path for step, paths in stamped_samples(trainer.output_dir).items() for path in paths
                 if path.suffix == ".png"}
        if final.suffix == ".png" and grids:
            frames = [grids[step] for step in gif_steps(grids, trainer.config.gif_frames)]
            save_gif(frames, trainer.output_dir / PROGRESS_GIF)

    def prune(self, trainer: "GANTrainer") -> None:
        """With ``keep_samples``: remove step-stamped samples older than the newest K, except the GIF's frames."""
        config = trainer.config
        if config.keep_samples is None:
            return
        found = stamped_samples(trainer.output_dir)
        if len(found) <= config.keep_samples:
            return
        shown = scheduled_gif_steps(config.sample_every, config.max_steps, config.gif_frames)
        if shown is None:  # every grid of the run is a frame of the GIF
            return
        for old in sorted(found)[:-config.keep_samples]:
            if old not in shown:
                for path in found[old]:
                    path.unlink(missing_ok=True)

    def write(self, trainer: "GANTrainer", stem: str) -> Path:
        """Samples of the fixed latents as ``<stem>.png`` (grid or scatter) or ``<stem>.pt``."""
        return draw_samples(trainer, trainer.output_dir / stem, self.kind)


def draw_samples(trainer: "GANTrainer", stem: Path, kind: str = "auto") -> Path:
    """The fixed latents' samples as ``<stem>.png`` (a grid, one row per class in a conditional run, or a scatter
    plot over real points) or ``<stem>.pt``."""
    samples = trainer.generate()
    if kind == "auto":
        kind = "grid" if is_image_batch(samples) else "scatter" if is_point_batch(samples) else "tensor"
    if kind == "grid":
        columns = trainer.conditioning.per_class(trainer.config.num_samples) if trainer.fixed_labels is not None \
            else None
        return save_grid(samples, Path(f"{stem}.png"), nrow=columns)
    if kind == "scatter":
        return save_scatter(samples, Path(f"{stem}.png"), reference=trainer.reference_samples,
                            title=f"step {trainer.step}")
    path = Path(f"{stem}.pt")
    with atomic_path(path) as tmp:  # replaces a link there itself, never writes through it
        torch.save(samples.cpu(), tmp)
    return path
