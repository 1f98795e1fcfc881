"""Pictures, drawn with Pillow and torchvision only and always written atomically.

* :mod:`~gan_accel.pictures.samples`: sample grids, scatter plots of 2-D points, animated GIFs;
* :mod:`~gan_accel.pictures.training_plot`: a run's metrics log as line charts;
* :mod:`~gan_accel.pictures.charts`: the chart axes both use.

When they are drawn is decided elsewhere: during training by the ``sample_saver`` and
``training_plot`` callbacks, on demand by ``gan-accel sample`` and ``gan-accel plot``.
"""

from .charts import PlotArea
from .samples import is_image_batch, is_point_batch, save_gif, save_grid, save_scatter, to_grid
from .training_plot import PANELS, plot_metrics, plot_run, plot_size

__all__ = ["PlotArea", "is_image_batch", "is_point_batch", "save_gif", "save_grid", "save_scatter", "to_grid",
           "PANELS", "plot_metrics", "plot_run", "plot_size"]
