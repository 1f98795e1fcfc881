"""The pickle-based files Accelerate reads from a checkpoint, opened so that no code can run.

Accelerate writes optimizers, schedulers, the fp16 scaler, the sampler and RNG states with ``torch.save`` (a
pickle), and unpickling runs whatever a file names. Every such file is opened here with
``torch.load(weights_only=True)`` (plus the few numpy types Accelerate's RNG state needs, its own allow-list);
a file that needs more is refused in one line naming it. :func:`check_checkpoint_files` does this for every
file *before* ``load_state``, so no Accelerate version (nor a ``register_for_checkpointing`` object, which it
unpickles with ``weights_only=False``) unpickles a payload through gan_accel.
"""

from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import UnsafeFileError
from .files import first_line
from .reading import MAX_TENSOR_BYTES, check_regular_file, load_weights_only, open_file
from .safe_tree import check_tree_file

PICKLE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth")
SAFE_PICKLES = "tensors, containers and plain values"
_REASON = re.compile(r"(Unsupported (?:global|operand|class)[^\n.]*|GLOBAL [\w.]+[^\n.]*)")


def numpy_globals() -> list[Any]:
    """What Accelerate's ``random_states_<rank>.pkl`` needs beyond tensors: numpy's RNG state is a tuple of a
    name, a uint32 array and numbers (arrays of numbers only: an object array's items pass the same allow-list)."""
    import codecs

    import numpy as np

    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None and hasattr(dtypes, "UInt32DType"):
        allowed.append(dtypes.UInt32DType)
    return allowed


@contextmanager
def _allowed(extra: list[Any]) -> Iterator[None]:
    """``extra`` added to torch's weights-only allow-list while the block runs (torch >= 2.5: ``safe_globals``;
    torch 2.4: added, then the previous list put back)."""
    serialization = torch.serialization
    if not extra:
        yield
    elif hasattr(serialization, "safe_globals"):
        with serialization.safe_globals(extra):
            yield
    else:  # pragma: no cover - torch 2.4
        before = serialization.get_safe_globals()
        serialization.add_safe_globals(extra)
        try:
            yield
        finally:
            serialization.clear_safe_globals()
            serialization.add_safe_globals(before)


def load_pickle(path: str | Path, numpy: bool = False, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU; ``numpy``: numpy arrays allowed (RNG states); ``mmap``:
    map the tensors instead of reading them. Raises :class:`UnsafeFileError` in one line naming the file."""
    path = Path(path)
    check_regular_file(path)
    try:
        with warnings.catch_warnings(), _allowed(numpy_globals() if numpy else []):
            warnings.simplefilter("ignore")  # torch notes the pickle protocol; the verdict is ours to say
            try:
                return load_weights_only(path, mmap=mmap)
            except RuntimeError as error:
                if not (mmap and "mmap can only be used" in str(error)):
                    raise
                return load_weights_only(path)  # an old (non-zip) torch.save file
    except UnsafeFileError:
        raise
    except Exception as error:
        raise unsafe_or_corrupt(path, error) from None


def pickled_call(path: str | Path) -> str | None:
    """The first callable a plain pickle file names (``posix.system``), read opcode by opcode without running
    anything; None when it names none, or is no well-formed pickle (random or damaged bytes)."""
    import pickletools

    strings: list[str] = []
    try:
        with open_file(path, MAX_TENSOR_BYTES) as handle:
            for opcode, argument, _ in pickletools.genops(handle):
                if opcode.name in ("GLOBAL", "INST"):
                    return str(argument).replace(" ", ".")
                if opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                    return f"{strings[-2]}.{strings[-1]}"
                if isinstance(argument, str):
                    strings.append(argument)
    except Exception:  # not a pickle: what weights_only refused was damage, not code
        return None
    return None


def unsafe_or_corrupt(path: Path, error: BaseException) -> UnsafeFileError:
    """The one line for a pickle-based file that ``weights_only=True`` would not load: "could run code" only for a
    file that names a callable (a refused global), "truncated or corrupt" for bytes that are no pickle at all."""
    text = str(error)
    found = _REASON.search(text)
    names_global = found is not None and "operand" not in found.group(1)
    call = None if names_global else pickled_call(path)
    if names_global or call is not None:
        what = f" ({found.group(1).strip()})" if names_global else f" (GLOBAL {call})"
        return UnsafeFileError(
            f"{path} holds more than {SAFE_PICKLES}{what}: unpickling it could run code, so gan_accel does not load "
            "it; use checkpoints you or gan_accel wrote (see docs/security.md to convert one you trust)")
    # torch's own text for a refusal speaks of code execution: not the story for bytes that are no pickle
    reason = (found.group(1).strip() if found else "no pickle") if "Weights only load failed" in text \
        else first_line(error)
    return UnsafeFileError(f"cannot read {path} (truncated or corrupt?): {reason}")


def check_checkpoint_files(folder: str | Path) -> None:
    """Refuse a checkpoint (one line naming the file) unless every pickle loads with ``weights_only=True``, every
    gan_accel state file is a well-formed safe tree and none is a FIFO or device. Tensors are mapped, not read;
    every process checks every file, so all reach the same verdict (none is left waiting in a collective)."""
    folder = Path(folder)
    for path in sorted(folder.rglob("*")):
        if path.suffix in PICKLE_SUFFIXES:
            load_pickle(path, numpy=True, mmap=True)
        elif path.suffix == ".safetensors":
            check_regular_file(path)
            if path.name.startswith("gan_accel_"):
                check_tree_file(path)
