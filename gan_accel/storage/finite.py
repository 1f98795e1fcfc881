"""Non-finite weights named where weights are loaded: one line naming the file and the tensor.

G with a NaN in its weights samples an all-black grid, evaluates to nonsense and, resumed, diverges at once with
the blame on the learning rate. A checkpoint written by gan_accel never holds such weights (a run refuses to
save them), so a file that does was damaged, edited, or written by something else: loading it stops here,
before it is used, naming the file and its first broken tensor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from ..errors import NonFiniteWeightsError


def non_finite_tensors(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, int, int]]:
    """(name, how many values are NaN or inf, how many values it has) of each floating tensor with any, in order."""
    found = []
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and (tensor.is_floating_point() or tensor.is_complex()):
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                found.append((name, bad, tensor.numel()))
    return found


ANOTHER = "use another checkpoint or export of the run"  # the way on for a run's weights


def check_finite(tensors: Mapping[str, torch.Tensor], file: str | os.PathLike, what: str = "tensor",
                 fix: str = ANOTHER) -> None:
    """Raise :class:`NonFiniteWeightsError` (one line naming ``file`` and the first broken tensor) when any floating
    tensor of ``tensors`` holds NaN or inf; ``what`` names the tensors ("tensor", "the EMA of G's tensor"), ``fix``
    says the way on."""
    found = non_finite_tensors(tensors)
    if not found:
        return
    name, bad, total = found[0]
    more = f" (and {len(found) - 1} more tensor(s))" if len(found) > 1 else ""
    raise NonFiniteWeightsError(
        f"{file}: {what} {name} holds {bad:,} NaN/inf value(s) of {total:,}{more}: these weights are broken (the "
        f"file was damaged, or saved from a model that diverged); {fix}")
