"""The engine: the loop (trainer.py), the step as phases (phases.py, runner.py), what a phase sees
(context.py, batch.py, latents.py), and the Accelerate plumbing (launch.py, schedules.py), with the
checks that run before training (preflight.py) and the divergence guard (guard.py)."""

from ..batch import RealBatch, extract_images, split_batch
from .context import StepContext
from .control import Control, RunState
from .latents import LatentSampler, gaussian_latents
from .launch import build_accelerator
from .phases import Phase, PhasePlan, default_phases, r1_phase
from .trainer import GANTrainer

__all__ = ["GANTrainer", "RunState", "Control", "Phase", "PhasePlan", "default_phases", "r1_phase", "StepContext", "RealBatch",
           "split_batch", "extract_images", "LatentSampler", "gaussian_latents", "build_accelerator"]
