"""Moved to :mod:`gan_accel.pictures.training_plot`; these names keep working."""

from .pictures.training_plot import COLUMNS, PANEL_SIZE, PANELS, PLOT_FILE, plot_metrics, plot_run, plot_size

__all__ = ["COLUMNS", "PANEL_SIZE", "PANELS", "PLOT_FILE", "plot_metrics", "plot_run", "plot_size"]
