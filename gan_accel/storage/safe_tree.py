"""A file format that holds a tree of plain values and tensors, and runs no code when read.

``save_tree(obj, path)`` writes the tensors as the safetensors file's tensors (keys ``"0"``, ``"1"``, ...) and
the tree around them as JSON in its metadata (key :data:`TREE_KEY`); ``load_tree(path)`` gives back an equal
tree (tensors on the CPU). A tree holds dicts (keys: str, int, float, bool, None or tuples of these), lists,
tuples, str, int, float (also NaN, inf, -0.0), bool, None and dense tensors; anything else is refused when
writing, naming where it is. Subclasses come back as their base type (an ``OrderedDict`` as a ``dict``), a
tensor that appears twice as two tensors. Reading parses JSON and safetensors only: no pickle, no import.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import CheckpointError, UnsafeFileError
from .files import first_line, write_bytes_synced
from .reading import open_safetensors

TREE_KEY = "gan_accel_tree"
FORMAT = "gan_accel.tree/1"
MAX_DEPTH = 64  # nesting of containers; the engine state needs about 6
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_KEY_TYPES = (str, int, float, bool, type(None), tuple)
ALLOWED = "dicts, lists, tuples, str, int, float, bool, None and tensors"


def save_tree(obj: Any, path: str | os.PathLike) -> Path:
    """Write ``obj`` (a tree of :data:`ALLOWED`) to ``path``, atomically; raises :class:`CheckpointError` on any
    other value, naming where it is in the tree. A write failure raises ``OSError`` (see ``write_bytes_synced``)."""
    write_bytes_synced(path, tree_bytes(obj, Path(path).name))
    return Path(path)


def tree_bytes(obj: Any, name: str = "the tree") -> bytes:
    """The bytes :func:`save_tree` writes."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(obj, tensors, "", name, 0)
    metadata = {TREE_KEY: json.dumps({"format": FORMAT, "tree": structure}, allow_nan=False, separators=(",", ":"))}
    try:
        return save(tensors, metadata=metadata)
    except Exception as error:  # an unsupported dtype, ...
        raise CheckpointError(f"cannot save {name} as safetensors: {first_line(error)}") from error


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str, name: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise CheckpointError(f"cannot save {name}: {where or 'the tree'} is nested deeper than {MAX_DEPTH} levels")
    if value is None:
        return None
    for kind in (bool, str, int):  # bool before int: bool is an int; a subclass is stored as its base type
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, float):
        value = float(value)
        if math.isnan(value):
            return {"float": "nan"}
        if math.isinf(value):
            return {"float": "inf" if value > 0 else "-inf"}
        return value
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.is_meta:
            raise CheckpointError(f"cannot save {name}: {where or 'the tree'} is a {value.layout} "
                                  f"{'quantized ' if value.is_quantized else ''}tensor; only dense tensors are stored")
        key = str(len(tensors))
        # A copy of its own: safetensors refuses tensors that share memory (views of one buffer, a tensor twice).
        tensors[key] = value.detach().to("cpu", copy=True).contiguous()
        return {"tensor": key}
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {"dict": {k: _encode(v, tensors, f"{where}[{k!r}]", name, depth + 1) for k, v in value.items()}}
        pairs = []
        for k, v in value.items():
            if not isinstance(k, _KEY_TYPES) or isinstance(k, torch.Tensor):
                raise CheckpointError(f"cannot save {name}: {where or 'the tree'} has a key of type "
                                      f"{_type_name(k)}; keys may be str, int, float, bool, None or tuples of these")
            pairs.append([_encode(k, tensors, f"{where}.keys()", name, depth + 1),
                          _encode(v, tensors, f"{where}[{k!r}]", name, depth + 1)])
        return {"pairs": pairs}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, tensors, f"{where}[{i}]", name, depth + 1) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{where}[{i}]", name, depth + 1) for i, v in enumerate(value)]
    raise CheckpointError(
        f"cannot save {name}: {where or 'the tree'} is a {_type_name(value)}, and a checkpoint holds only {ALLOWED} "
        "(convert it in the state_dict that returns it, e.g. a numpy array with torch.from_numpy)")


def load_tree(path: str | os.PathLike) -> Any:
    """The tree :func:`save_tree` wrote to ``path`` (tensors on the CPU). Raises :class:`UnsafeFileError` (one line
    naming the file) for anything else: another format, a malformed tree, a reference to a missing tensor."""
    return _read(Path(path), with_tensors=True)


def check_tree_file(path: str | os.PathLike) -> None:
    """Check a :func:`save_tree` file as :func:`load_tree` does, without reading its tensors (cheap)."""
    _read(Path(path), with_tensors=False)


def _read(path: Path, with_tensors: bool) -> Any:
    try:
        with open_safetensors(path) as handle:  # a regular file of bounded size, or one line naming it
            text = (handle.metadata() or {}).get(TREE_KEY)
            if text is None:
                raise _refuse(path, f"it has no {TREE_KEY!r} entry in its metadata (not a gan_accel state file)")
            present = set(handle.keys())

            def tensor(key: Any) -> torch.Tensor | None:
                if not isinstance(key, str) or key not in present:
                    raise _refuse(path, f"its tree refers to a tensor {str(key)[:40]!r} the file does not hold")
                return handle.get_tensor(key) if with_tensors else None

            return _decode(path, _parse(path, text), tensor, 0)
    except UnsafeFileError:
        raise
    except Exception as error:  # safetensors' own errors for a truncated or foreign file, OSError
        raise _refuse(path, f"it is not a readable safetensors file (truncated or corrupt?): {first_line(error)}") \
            from None


def _parse(path: Path, text: str) -> Any:
    def no_constants(word: str) -> Any:
        raise ValueError(f"non-standard JSON constant {word}")

    try:
        document = json.loads(text, parse_constant=no_constants)
    except (ValueError, RecursionError) as error:
        raise _refuse(path, f"its {TREE_KEY!r} metadata is not valid JSON ({first_line(error)})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or "tree" not in document:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise _refuse(path, f"its {TREE_KEY!r} metadata is not format {FORMAT!r} (found {str(found)[:40]!r}): "
                            "written by a newer gan_accel, or by something else")
    return document["tree"]


def _decode(path: Path, node: Any, tensor: Callable[[Any], torch.Tensor | None], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise _refuse(path, f"its tree is nested deeper than {MAX_DEPTH} levels")
    if node is None or isinstance(node, (bool, int, str, float)):
        return node
    if isinstance(node, list):
        return [_decode(path, v, tensor, depth + 1) for v in node]
    if isinstance(node, dict) and len(node) == 1:
        (tag, body), = node.items()
        if tag == "tensor":
            return tensor(body)
        if tag == "float" and body in _FLOATS:
            return _FLOATS[body]
        if tag == "tuple" and isinstance(body, list):
            return tuple(_decode(path, v, tensor, depth + 1) for v in body)
        if tag == "dict" and isinstance(body, dict):
            return {k: _decode(path, v, tensor, depth + 1) for k, v in body.items()}
        if tag == "pairs" and isinstance(body, list):
            result = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise _refuse(path, "its tree has a malformed dict entry (expected [key, value])")
                key = _decode(path, pair[0], tensor, depth + 1)
                if not isinstance(key, _KEY_TYPES) or not _hashable(key):
                    raise _refuse(path, f"its tree has a dict key of type {type(key).__name__}")
                result[key] = _decode(path, pair[1], tensor, depth + 1)
            return result
    shown = json.dumps(node)[:60] if not isinstance(node, dict) or len(node) < 5 else "an object"
    raise _refuse(path, f"its tree holds {shown}, which is not a value of format {FORMAT!r}")


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _refuse(path: Path, reason: str) -> UnsafeFileError:
    return UnsafeFileError(f"cannot read {path}: {reason}")


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
