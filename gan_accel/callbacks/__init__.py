"""Side concerns that hang off the training loop's events (see :mod:`gan_accel.callbacks.base`).

The built-in callbacks are :data:`BUILTIN_CALLBACKS`, in the order they run; a run has those its
config asks for (:func:`default_callbacks`). Add your own with ``GANTrainer(callbacks=[...])``; one
named like a built-in replaces it; ``disable_callbacks=("sample_saver",)`` switches built-ins off.
"""

from ..ending import SignalHandler
from .base import EVENTS, Callback, CallbackList
from .checkpoints import Checkpointer
from .ema import EMA, GeneratorEMA
from .evaluation import Evaluator
from .export import WeightsExporter
from .health import HealthMonitor
from .metrics_log import MetricsLogger, read_metrics
from .overfit_steering import OverfitSteering
from .progress import ProgressBar
from .sample_saver import SampleSaver
from .trackers import TrackerLogger
from .training_plot import TrainingPlot

__all__ = ["EVENTS", "Callback", "CallbackList", "Checkpointer", "EMA", "GeneratorEMA", "Evaluator",
           "WeightsExporter", "HealthMonitor", "MetricsLogger", "read_metrics", "OverfitSteering", "ProgressBar",
           "SampleSaver", "SignalHandler", "TrackerLogger", "TrainingPlot", "default_callbacks", "BUILTIN_CALLBACKS"]

# The built-in callbacks, in the order they run (each is named after its class: see Callback.name).
BUILTIN_CLASSES = (GeneratorEMA, MetricsLogger, HealthMonitor, TrackerLogger, ProgressBar, SampleSaver, TrainingPlot,
                   Checkpointer, WeightsExporter, SignalHandler)
BUILTIN_CALLBACKS = tuple(cls.name for cls in BUILTIN_CLASSES)


def default_callbacks(config) -> list[Callback]:
    """The built-in callbacks a :class:`~gan_accel.TrainConfig` asks for, in the order of :data:`BUILTIN_CALLBACKS`."""
    wanted: dict[type, Callback] = {
        MetricsLogger: MetricsLogger(), HealthMonitor: HealthMonitor(), SampleSaver: SampleSaver(),
        TrainingPlot: TrainingPlot(), Checkpointer: Checkpointer(config.keep_checkpoints),
        WeightsExporter: WeightsExporter(), SignalHandler: SignalHandler(), ProgressBar: ProgressBar(),
    }
    if config.ema_decay or config.ema_half_life:
        wanted[GeneratorEMA] = GeneratorEMA(config.ema_decay or None, half_life_images=config.ema_half_life,
                                            rampup=config.ema_rampup, batchnorm=config.ema_batchnorm)
    if config.log_with:  # experiment trackers through Accelerate (TensorBoard, MLflow, W&B, ...)
        wanted[TrackerLogger] = TrackerLogger()
    return [wanted[cls] for cls in BUILTIN_CLASSES if cls in wanted]
