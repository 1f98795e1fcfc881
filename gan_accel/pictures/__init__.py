"""Pictures, drawn with Pillow and torchvision only and always written atomically: sample grids, scatter
plots and GIFs (:mod:`~gan_accel.pictures.grids`), a run's metrics as line charts
(:mod:`~gan_accel.pictures.training_plot`), and the chart axes both use (:mod:`~gan_accel.pictures.charts`).
"""

from .charts import PlotArea
from .grids import is_image_batch, is_point_batch, save_gif, save_grid, save_scatter, to_grid
from .training_plot import PANELS, plot_metrics, plot_run, plot_size

__all__ = ["PlotArea", "is_image_batch", "is_point_batch", "save_gif", "save_grid", "save_scatter", "to_grid",
           "PANELS", "plot_metrics", "plot_run", "plot_size"]
