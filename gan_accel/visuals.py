"""Moved to :mod:`gan_accel.pictures` (sample grids, scatter plots, GIFs); these names keep working."""

from .pictures.charts import PlotArea
from .pictures.samples import is_image_batch, is_point_batch, save_gif, save_grid, save_scatter, to_grid

__all__ = ["PlotArea", "is_image_batch", "is_point_batch", "save_gif", "save_grid", "save_scatter", "to_grid"]
