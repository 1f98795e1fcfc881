"""Side concerns that hang off the training loop's events (see :mod:`gan_accel.callbacks.base`).

Built in, in this order: ``ema``, ``metrics_log``, ``health``, ``trackers`` (with ``log_with``), ``progress``, ``samples``, ``plot``,
``checkpoints``, ``export``, ``signals``. Add your own with ``GANTrainer(callbacks=[...])``; one with the name of a
built-in replaces it; ``disable_callbacks=("samples",)`` switches built-ins off.
"""

from .base import EVENTS, Callback, CallbackList
from .checkpoints import Checkpointer
from .ema import EMA, EMACallback
from .evaluation import Evaluator
from .export import WeightsExporter
from .health import HealthMonitor
from .metrics_log import MetricsLog, MetricsLogger, read_metrics
from .plot import TrainingPlot
from .progress import ProgressBar
from .samples import SampleSaver
from .signals import SignalHandler
from .trackers import TrackerLogger

__all__ = ["EVENTS", "Callback", "CallbackList", "Checkpointer", "EMA", "EMACallback", "Evaluator", "WeightsExporter", "HealthMonitor",
           "MetricsLog", "MetricsLogger", "read_metrics", "ProgressBar", "SampleSaver", "SignalHandler", "TrackerLogger", "TrainingPlot",
           "default_callbacks", "BUILTIN_CALLBACKS"]

BUILTIN_CALLBACKS = ("ema", "metrics_log", "health", "trackers", "progress", "samples", "plot", "checkpoints", "export",
                     "signals")


def default_callbacks(config) -> list[Callback]:
    """The built-in callbacks a :class:`~gan_accel.TrainConfig` asks for, in their fixed order."""
    callbacks: list[Callback] = []
    if config.ema_decay or config.ema_half_life:
        callbacks.append(EMACallback(config.ema_decay or None, half_life_images=config.ema_half_life,
                                     rampup=config.ema_rampup, batchnorm=config.ema_batchnorm))
    callbacks += [MetricsLogger(), HealthMonitor()]
    if config.log_with:  # experiment trackers through Accelerate (TensorBoard, MLflow, W&B, ...)
        callbacks.append(TrackerLogger())
    if config.progress_bar:
        callbacks.append(ProgressBar())
    callbacks += [SampleSaver(), TrainingPlot(), Checkpointer(config.keep_checkpoints), WeightsExporter(),
                  SignalHandler()]
    return callbacks
