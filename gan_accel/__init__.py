"""gan_accel: train GANs with custom loops on Hugging Face Accelerate."""

from .checkpoint import CheckpointError, latest_checkpoint, list_checkpoints
from .config import ConfigError, TrainConfig
from .engine import GANTrainer, extract_images
from .guard import DivergenceError
from .launch import LaunchError, build_accelerator
from .preflight import PreflightError
from .signals import TrainingInterrupted
from .losses import LOSSES, GANLoss, get_loss
from .schedules import lambda_scheduler, warmup_then_decay

__all__ = [
    "GANTrainer",
    "TrainConfig",
    "ConfigError",
    "CheckpointError",
    "DivergenceError",
    "PreflightError",
    "TrainingInterrupted",
    "latest_checkpoint",
    "list_checkpoints",
    "LaunchError",
    "GANLoss",
    "LOSSES",
    "get_loss",
    "build_accelerator",
    "extract_images",
    "lambda_scheduler",
    "warmup_then_decay",
]
__version__ = "0.1.0"
