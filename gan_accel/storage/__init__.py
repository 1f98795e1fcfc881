"""What a run leaves on disk: checkpoints, the run folder's files, exported weights, atomic writes."""

from .checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, resolve_resume, save_checkpoint
from .weights import load_weights, save_weights

__all__ = ["latest_checkpoint", "list_checkpoints", "load_checkpoint", "resolve_resume", "save_checkpoint",
           "load_weights", "save_weights"]
