"""gan_accel: train GANs with custom loops on Hugging Face Accelerate.

The public API, by job: the trainer and its config (and :func:`settle`, which settles a run's config and networks
from the settings given, the data and the machine, as ``gan-accel train`` does); phases and phase losses (the step as data);
callbacks (side concerns); regularisers; errors. Data, models, evaluation and checkpoint helpers
live in their sub-packages (``gan_accel.data``, ``gan_accel.models``, ``gan_accel.eval``,
``gan_accel.storage``); sampling a trained run in ``gan_accel.sampling``; sharing it in ``gan_accel.hub``,
whose :func:`load_generator` is here too (G from an exported folder, a Hub repo id, a run or a checkpoint).
"""

from .callbacks import Callback
from .config import Ramp, TrainConfig
from .engine import GANTrainer, Phase, StepContext, build_accelerator, default_phases, extract_images, r1_phase
from .engine.schedules import lambda_scheduler, warmup_then_decay
from .errors import (CallbackError, CheckpointError, ConfigError, DivergenceError, GanAccelError, LaunchError,
                     PhaseError, PreflightError, PreflightWarning, RunFolderError, TrainingInterrupted)
from .objectives import (LOSSES, GANLoss, discriminator_loss, generator_loss, get_loss, gradient_penalty, r1_penalty,
                         sum_losses)
from .hub import load_generator
from .settle import DataFacts, SettledRun, settle
from .storage.checkpoint import latest_checkpoint, list_checkpoints

__all__ = [
    "GANTrainer", "TrainConfig", "Ramp", "settle", "DataFacts", "SettledRun",
    "Phase", "StepContext", "default_phases", "r1_phase",
    "GANLoss", "LOSSES", "get_loss", "discriminator_loss", "generator_loss", "sum_losses",
    "r1_penalty", "gradient_penalty",
    "Callback",
    "GanAccelError", "ConfigError", "PreflightError", "PreflightWarning", "PhaseError", "LaunchError",
    "CheckpointError", "DivergenceError", "CallbackError", "TrainingInterrupted", "RunFolderError",
    "latest_checkpoint", "list_checkpoints", "load_generator",
    "build_accelerator", "extract_images", "lambda_scheduler", "warmup_then_decay",
]
__version__ = "0.3.0"  # the one place the version is written (pyproject.toml reads it)
