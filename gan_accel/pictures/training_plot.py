"""A picture of a run: its metrics rows as line charts, one panel per concern (:data:`PANELS`, then the panels
of D's probe and of the augmentation for runs that log them), step on every x axis, drawn with Pillow only. A value that is not
finite breaks its line and is marked by a red tick on the panel's top edge (and counted in the legend).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import RunFolderError
from ..storage.files import atomic_path
from ..storage.layout import METRICS, TRAINING_PLOT, read_metrics_tolerant
from .charts import PlotArea

PANEL_SIZE = (560, 300)  # one panel, pixels; the picture is 2 panels wide and 3 (or 4) high
COLUMNS = 2
COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))
_NON_FINITE = (220, 0, 0)


def _prefix(prefix: str) -> Callable[[str], bool]:
    return lambda key: key.startswith(prefix)


def _one_of(*keys: str) -> Callable[[str], bool]:
    return lambda key: key in keys


# (title, which keys the panel shows)
PANELS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("losses", _prefix("loss/")),
    ("discriminator outputs (mean logits; d_spread: their spread on D's probe)",
     _one_of("D(x)", "D(G(z))", "health/d_spread")),
    ("gradient norms", _prefix("grad_norm/")),
    ("learning rates", _prefix("lr/")),
    ("sample diversity (mean pairwise distance)", _one_of("health/diversity")),
    ("images/s", _one_of("images/s")),
)
# Drawn only for runs that log their keys. D's probe: overfit (0: D judges unseen reals like its training
# images, 1: like fakes) and rt (the probe pairs D orders right); both about 0..1, so they share an axis.
PROBE_PANEL = ("D's probe (overfit: held-out reals vs training reals; rt: reals above fakes)",
               _one_of("health/overfit", "health/rt"))
# An augmented run's probability p and ADA's statistic r_t.
AUGMENT_PANEL = ("augmentation (p; ADA's r_t: mean sign of D(x), or of D(x) - D(G(z)) for rpgan)", _prefix("augment/"))


def plot_size(panels: int = len(PANELS)) -> tuple[int, int]:
    """The picture's (width, height) in pixels, for ``panels`` panels."""
    rows = math.ceil(panels / COLUMNS)
    return PANEL_SIZE[0] * COLUMNS, PANEL_SIZE[1] * rows


def panels_for(rows: Sequence[dict[str, Any]]) -> tuple[tuple[str, Callable[[str], bool]], ...]:
    """The panels a picture of ``rows`` has: :data:`PANELS`, then D's probe and the augmentation when logged."""
    logged = {key for row in rows for key in row}
    return PANELS + tuple(extra for extra in (PROBE_PANEL, AUGMENT_PANEL) if any(map(extra[1], logged)))


def plot_metrics(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Draw metrics rows (each with a ``step``) as a PNG of line charts at ``path`` (written atomically).

    Keys a row lacks are gaps; values that are not numbers are ignored; non-finite ones are marked.
    """
    from PIL import Image, ImageDraw

    panels = panels_for(rows)
    image = Image.new("RGB", plot_size(len(panels)), "white")
    draw = ImageDraw.Draw(image)
    steps = [float(row["step"]) for row in rows if _finite(row.get("step"))]
    x_range = _padded(min(steps), max(steps)) if steps else (0.0, 1.0)
    for index, (title, selects) in enumerate(panels):
        left = (index % COLUMNS) * PANEL_SIZE[0]
        top = (index // COLUMNS) * PANEL_SIZE[1]
        keys = sorted({key for row in rows for key in row if selects(key) and _is_number(row[key])},
                      key=lambda key: (key != "D(x)", key))  # D(x) before D(G(z)), as it is said
        _draw_panel(draw, (left, top), title, {key: _series(rows, key) for key in keys}, x_range)
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG")
    return Path(path)


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Plot ``<run_dir>/metrics.jsonl`` to ``out`` (default ``<run_dir>/training_plot.png``); returns the path.

    Raises :class:`~gan_accel.errors.RunFolderError` when the folder has no metrics rows to draw.
    """
    log = Path(run_dir) / METRICS
    if not log.is_file():
        raise RunFolderError(f"{log} does not exist: plot a run folder (the output_dir of a run that has "
                             "logged at least one row, every log_every steps)")
    rows = run_rows(log)
    if not rows:
        raise RunFolderError(f"{log} has no metrics rows yet: plot again once the run has logged its first "
                             "row (every log_every steps)")
    return plot_metrics(rows, Path(run_dir) / TRAINING_PLOT if out is None else out)


def run_rows(log: Path) -> list[dict[str, Any]]:
    """The rows of a metrics log; a line cut short by a crash is skipped, not fatal."""
    return [row for row in read_metrics_tolerant(log)[0] if isinstance(row, dict) and "step" in row]


# -- drawing ------------------------------------------------------------------------------------------
def _draw_panel(draw: Any, origin: tuple[int, int], title: str, series: dict[str, list[tuple[float, float]]],
                x_range: tuple[float, float]) -> None:
    left, top = origin
    width, height = PANEL_SIZE
    draw.text((left + width / 2, top + 6), title, fill="black", anchor="mt")
    finite = [y for points in series.values() for _, y in points if math.isfinite(y)]
    y_range = _padded(min(finite), max(finite)) if finite else (0.0, 1.0)
    area = PlotArea(draw, (left + 64, top + 50, left + width - 16, top + height - 28), x_range, y_range)
    area.draw_axes()
    frame_top = area.box[1]
    if not series:
        draw.text(((area.box[0] + area.box[2]) / 2, (area.box[1] + area.box[3]) / 2), "no data", fill="gray",
                  anchor="mm")
    legend_x, legend_y = left + 64, top + 28  # the legend: one or two lines under the title
    for number, (key, points) in enumerate(series.items()):
        colour = COLOURS[number % len(COLOURS)]
        bad = _draw_series(draw, area, points, colour, frame_top)
        label = key + (f" ({bad} non-finite)" if bad else "")
        room = 24 + int(draw.textlength(label))
        if legend_x + room > left + width and legend_x > left + 64:
            legend_x, legend_y = left + 64, legend_y + 13
        draw.rectangle([legend_x, legend_y - 4, legend_x + 10, legend_y + 4], fill=colour)
        draw.text((legend_x + 14, legend_y), label, fill="black", anchor="lm")
        legend_x += room


def _draw_series(draw: Any, area: PlotArea, points: list[tuple[float, float]], colour: tuple[int, int, int],
                 frame_top: float) -> int:
    """Lines between consecutive finite points, a dot on each when there are few; returns the non-finite count."""
    segment: list[tuple[float, float]] = []
    bad = 0
    few = len(points) <= 60
    for x, y in points:
        px, py = area.to_pixel(x, y) if math.isfinite(y) else (area.to_pixel(x, 0.0)[0], None)
        if py is None:  # a NaN/inf value: its line breaks, a red tick marks the step
            bad += 1
            draw.line([px, frame_top, px, frame_top + 8], fill=_NON_FINITE, width=2)
            _flush(draw, segment, colour)
            segment = []
            continue
        segment.append((px, py))
        if few:
            draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=colour)
    _flush(draw, segment, colour)
    return bad


def _flush(draw: Any, segment: list[tuple[float, float]], colour: tuple[int, int, int]) -> None:
    if len(segment) > 1:
        draw.line(segment, fill=colour, width=2)


# -- data ---------------------------------------------------------------------------------------------
def _series(rows: Sequence[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) of the rows that have ``key`` as a number, in step order."""
    points = [(float(row["step"]), float(row[key])) for row in rows
              if _finite(row.get("step")) and _is_number(row.get(key))]
    return sorted(points, key=lambda point: point[0])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _padded(low: float, high: float) -> tuple[float, float]:
    """A range around [low, high] with 5% to spare on each side (a flat series gets a range around it)."""
    if high - low <= 1e-12 * max(abs(low), abs(high), 1e-300):
        spread = abs(low) * 0.1 or 1.0
        return low - spread, high + spread
    spare = (high - low) * 0.05
    return low - spare, high + spare
