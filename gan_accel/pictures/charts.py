"""Chart axes drawn with Pillow: a rectangle that maps data to pixels, with its frame and ticks."""

from __future__ import annotations

import math


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    raw = (high - low) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step) + 1)]


class PlotArea:
    """A rectangle of a PIL image showing ``x_range`` × ``y_range``: maps data to pixels, draws the frame
    and the ticks. ``clamp``: points outside the ranges are drawn on the border (else off the frame)."""

    def __init__(self, draw, box: tuple[float, float, float, float], x_range: tuple[float, float],
                 y_range: tuple[float, float], clamp: bool = False) -> None:
        self.draw, self.box, self.x_range, self.y_range, self.clamp = draw, box, x_range, y_range, clamp

    def to_pixel(self, x: float, y: float) -> tuple[float, float]:
        left, top, right, bottom = self.box
        u = (x - self.x_range[0]) / (self.x_range[1] - self.x_range[0])
        v = (y - self.y_range[0]) / (self.y_range[1] - self.y_range[0])
        if self.clamp:
            u, v = min(max(u, 0.0), 1.0), min(max(v, 0.0), 1.0)
        return left + u * (right - left), top + (1 - v) * (bottom - top)

    def draw_axes(self, colour: str = "black") -> None:
        """The frame, with ticks and their values below the x axis and left of the y axis."""
        left, top, right, bottom = self.box
        self.draw.rectangle([left, top, right, bottom], outline=colour)
        for tick in _nice_ticks(*self.x_range):
            x, _ = self.to_pixel(tick, self.y_range[0])
            self.draw.line([x, bottom, x, bottom + 4], fill=colour)
            self.draw.text((x, bottom + 6), f"{tick:g}", fill=colour, anchor="mt")
        for tick in _nice_ticks(*self.y_range):
            _, y = self.to_pixel(self.x_range[0], tick)
            self.draw.line([left - 4, y, left, y], fill=colour)
            self.draw.text((left - 6, y), f"{tick:g}", fill=colour, anchor="rm")
