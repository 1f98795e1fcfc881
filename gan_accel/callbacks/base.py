"""The callback protocol: side concerns hang off named events of the training loop (``EVENTS``, in firing
order; docs/callbacks.md lists when each fires and what a callback may touch).

Events fire on every process; within one, callbacks run in list order. A callback changes the run only
through ``trainer.control``, applied right after its handler returns; one that raises stops the run
with a :class:`~gan_accel.errors.CallbackError` naming it, the event and the step.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from ..errors import CallbackError, GanAccelError, RunFolderError
from ..storage.checkpoint import SHARED_STATE
from ..storage.files import is_write_failure, write_failure_reason

if TYPE_CHECKING:
    from ..engine.phases import Phase
    from ..engine.trainer import GANTrainer

EVENTS = ("on_fit_start", "on_phase_end", "on_step_end", "on_log", "on_sample", "on_checkpoint", "on_fit_end",
          "on_close")


def snake_case(class_name: str) -> str:
    """``SampleSaver`` -> ``sample_saver``; an acronym stays one word: ``GeneratorEMA`` -> ``generator_ema``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", class_name).lower()


class Callback:
    """Base class: override the events you need. ``name`` (what ``disable_callbacks`` takes, and the key of the
    state in checkpoints) is the snake case of the class name (``SampleSaver`` -> ``"sample_saver"``) unless set.
    ``setup(trainer)`` runs once when the callback joins a trainer (after ``prepare``, before any resume)."""

    name: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = snake_case(cls.__name__)

    def setup(self, trainer: "GANTrainer") -> None:
        """Called once when the callback joins ``trainer``."""

    def on_fit_start(self, trainer: "GANTrainer") -> None: ...
    def on_phase_end(self, trainer: "GANTrainer", phase: "Phase") -> None: ...
    def on_step_end(self, trainer: "GANTrainer") -> None: ...
    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None: ...
    def on_sample(self, trainer: "GANTrainer") -> None: ...
    def on_checkpoint(self, trainer: "GANTrainer") -> None: ...
    def on_fit_end(self, trainer: "GANTrainer") -> None: ...
    def on_close(self, trainer: "GANTrainer") -> None: ...

    def state_dict(self) -> dict[str, Any] | None:
        """State to checkpoint (None: nothing)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def _implements(callback: Any, event: str) -> bool:
    method = getattr(type(callback), event, None)
    return method is not None and method is not getattr(Callback, event, None)


class CallbackList:
    """An ordered list of callbacks with unique names, and the dispatcher of events to them."""

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self._callbacks: list[Any] = []
        self._trainer: GANTrainer | None = None
        self._after_each: Callable[[], None] = lambda: None
        for callback in callbacks:
            self.add(callback)

    # -- the list ------------------------------------------------------------------------------
    def add(self, callback: Any, *, before: str | None = None, after: str | None = None) -> None:
        """Add a callback (at the end, or before/after a named one). Its name must be new: see :meth:`replace`."""
        name = _name_of(callback)
        if name in self.names:
            raise ValueError(f"a callback named {name!r} is already registered: use replace({name!r}, ...) "
                             "or give yours another name")
        if before is not None and after is not None:
            raise ValueError("pass before= or after=, not both")
        index = len(self._callbacks)
        if before is not None:
            index = self._index(before)
        elif after is not None:
            index = self._index(after) + 1
        self._callbacks.insert(index, callback)
        self._rebuild()
        if self._trainer is not None:
            self._setup(callback)

    def replace(self, name: str, callback: Any) -> None:
        """Put ``callback`` in the place of the one named ``name``."""
        index = self._index(name)
        self._callbacks[index] = callback
        self._rebuild()
        if self._trainer is not None:
            self._setup(callback)

    def remove(self, name: str) -> Any:
        """Switch a callback off; returns it."""
        callback = self._callbacks.pop(self._index(name))
        self._rebuild()
        return callback

    def get(self, name: str, default: Any = None) -> Any:
        """The callback named ``name`` (or ``default``)."""
        return next((c for c in self._callbacks if _name_of(c) == name), default)

    @property
    def names(self) -> list[str]:
        return [_name_of(c) for c in self._callbacks]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._callbacks))

    def __len__(self) -> int:
        return len(self._callbacks)

    def _index(self, name: str) -> int:
        for index, callback in enumerate(self._callbacks):
            if _name_of(callback) == name:
                return index
        raise KeyError(f"no callback named {name!r}: registered are {self.names}")

    def _rebuild(self) -> None:
        # One list per event of the callbacks that implement it: firing an event nobody handles costs nothing.
        self._handlers = {event: [c for c in self._callbacks if _implements(c, event)] for event in EVENTS}

    # -- dispatch -------------------------------------------------------------------------------
    def bind(self, trainer: "GANTrainer", after_each: Callable[[], None] | None = None) -> None:
        """Attach to a trainer and run every callback's ``setup``; ``after_each`` runs after every handler."""
        self._trainer = trainer
        if after_each is not None:
            self._after_each = after_each
        for callback in self._callbacks:
            self._setup(callback)

    def _setup(self, callback: Any) -> None:
        setup = getattr(callback, "setup", None)
        if setup is not None:
            self._call(callback, "setup", setup, ())

    def fire(self, event: str, *args: Any) -> None:
        """Call ``event`` on every callback implementing it, in order, with the trainer first."""
        for callback in self._handlers[event]:
            self._call(callback, event, getattr(callback, event), args)

    def _call(self, callback: Any, event: str, method: Any, args: tuple) -> None:
        trainer = self._trainer
        try:
            method(trainer, *args)
            self._after_each()
        except (GanAccelError, KeyboardInterrupt):
            raise  # already says what happened and what to do
        except Exception as error:
            step = getattr(trainer, "step", "?")
            note = trainer.checkpoint_note() if trainer is not None else ""
            if is_write_failure(error):  # the disk, not the callback: say what failed and what is kept
                where = getattr(error, "filename", None) or f"a file of callback {_name_of(callback)!r}"
                raise RunFolderError(f"cannot write {where} at step {step}: {write_failure_reason(error)}. "
                                     f"{note}".strip()) from error
            raise CallbackError(
                f"callback {_name_of(callback)!r} ({type(callback).__name__}) failed in {event} at step {step}: "
                f"{type(error).__name__}: {error}. {note}".strip()
            ) from error

    def state_dict(self, include_shared: bool = True) -> dict[str, Any]:
        """Each callback's state by name; with ``include_shared=False`` the state of one with ``shared_state = True``
        (the same on every process, as the EMA's) is ``SHARED_STATE``, so a checkpoint keeps one copy."""
        states = {}
        for callback in self._callbacks:
            if not include_shared and getattr(callback, "shared_state", False):
                states[_name_of(callback)] = SHARED_STATE
                continue
            state = callback.state_dict() if hasattr(callback, "state_dict") else None
            if state is not None:
                states[_name_of(callback)] = state
        return states

    def load_state_dict(self, states: dict[str, Any]) -> None:
        for name, state in states.items():
            callback = self.get(name)
            if callback is not None and hasattr(callback, "load_state_dict"):
                callback.load_state_dict(state)


def assemble(builtins: Iterable[Any], user: Iterable[Any], disabled: Iterable[str],
             known: Iterable[str]) -> list[Any]:
    """Built-ins minus ``disabled``, then the user's callbacks; one named like a built-in takes its place."""
    disabled, known = set(disabled), list(known)
    unknown = disabled - set(known)
    if unknown:
        raise ValueError(f"disable_callbacks={sorted(unknown)}: built-in callbacks are {known}")
    merged = [c for c in builtins if _name_of(c) not in disabled]
    for callback in user:
        names = [_name_of(c) for c in merged]
        name = _name_of(callback)
        if name in names:
            merged[names.index(name)] = callback
        else:
            merged.append(callback)
    return merged


def _name_of(callback: Any) -> str:
    return str(getattr(callback, "name", "") or type(callback).__name__)
