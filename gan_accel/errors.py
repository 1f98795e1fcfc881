"""The errors gan_accel raises for problems a user can fix: each becomes one ``error:`` line (anything else
is a bug and keeps its traceback), and derives from the built-in type that describes it best."""

from __future__ import annotations


class GanAccelError(Exception):
    """Base class: a problem with the user's input, environment or run folder, with a message saying the fix."""


class ConfigError(GanAccelError, ValueError):
    """A :class:`~gan_accel.TrainConfig` field holds a value the engine cannot train with."""


class PreflightError(GanAccelError, ValueError):
    """The models, the phases, the data or the output folder cannot make a valid run."""


class PhaseError(GanAccelError, ValueError):
    """A phase list is malformed (unknown network, no phase that draws data, ...)."""


class LaunchError(GanAccelError, RuntimeError):
    """The processes were started in a way that would not train one shared model."""


class CheckpointError(GanAccelError, RuntimeError):
    """A checkpoint cannot be used to resume: missing, partial, corrupt, or from another model."""


class UnsafeFileError(CheckpointError):
    """A file gan_accel reads (a checkpoint's, a run folder's, a cache's) is not in the form it expects: a pickle
    holding more than tensors and plain data (unpickling it could run code), or a malformed safe file."""


class NonFiniteWeightsError(CheckpointError):
    """A file's weights hold NaN or inf values: loading them would sample black images or diverge at once."""


class ExportError(GanAccelError, ValueError):
    """A generator folder cannot be written, read or shared as asked; the message says the fix."""


class DivergenceError(GanAccelError, RuntimeError):
    """Too many consecutive non-finite updates: the run has diverged."""


class CallbackError(GanAccelError, RuntimeError):
    """A callback raised; the message names it, the event and the step."""


class TrainingInterrupted(GanAccelError):
    """Raised by ``fit`` after a signal-triggered final checkpoint. ``exit_code`` is 128 + the signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class PreflightWarning(UserWarning):
    """Something about the models or the data that usually means a mistake, but can be intended."""


class RunFolderError(GanAccelError, RuntimeError):
    """The run folder cannot be used as asked: held by another run, holds another run, or cannot be written."""


class DataError(GanAccelError, ValueError):
    """The training data cannot be used as given: a missing or empty source, no readable image, no labels
    for a conditional run, a column that is not there, a setting the images cannot be prepared with."""
