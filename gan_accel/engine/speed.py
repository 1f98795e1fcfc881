"""Opt-in speed options (off by default: none helps everywhere, see docs/benchmarks.md).

* ``channels_last``: 4-D weights converted in place before ``prepare`` (user-built optimizers still hold them).
* ``compile``: G and D compiled *after* ``prepare`` (after the DDP wrap); only the phase runner trains through
  the compiled views, and a ``double_backward`` phase calls the eager modules (same parameters).
* ``keep_freed_memory``: glibc's mmap and trim thresholds raised to 1 GiB, so a CPU step's large blocks are
  not returned and page-faulted back in, zero-filled, every step. Process-wide; the arithmetic is unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any, Callable, Mapping

import torch
from accelerate import Accelerator
from torch import nn

from ..config import TrainConfig
from ..errors import PreflightError
from .phases import PhasePlan

COMPILED_NETWORKS = ("G", "D")


def check_speed_options(accelerator: Accelerator, config: TrainConfig, plan: PhasePlan) -> None:
    """Refuse Accelerate's ``dynamo_backend`` with ``compile=True`` (twice compiled) or a double backward."""
    backend = getattr(getattr(accelerator.state, "dynamo_plugin", None), "backend", None)
    backend = getattr(backend, "value", backend)
    if backend in (None, "NO", "no"):
        return
    if config.compile:
        raise PreflightError(f"compile=True and the Accelerator's dynamo_backend={backend!r} both compile G and D: "
                             "keep compile=True and build the Accelerator without dynamo_backend")
    double = [p.name for p in plan.phases if p.double_backward]
    if double:
        raise PreflightError(f"the Accelerator compiles the networks (dynamo_backend={backend!r}) and phase "
                             f"{double[0]!r} needs a double backward, which torch.compile does not support: build the "
                             "Accelerator without dynamo_backend and set TrainConfig(compile=True), which runs such "
                             "phases eagerly")


def apply_memory_format(nets: Mapping[str, nn.Module], config: TrainConfig) -> None:
    """Channels-last weights for every network when ``config.channels_last`` (in place, before prepare); and every
    weight with a dimension of size 1 gets its gradients in its own strides (:func:`_keep_strides_of`)."""
    for net in nets.values():
        if config.channels_last:
            net.to(memory_format=torch.channels_last)
        for param in net.parameters():
            if param.dim() > 1 and 1 in param.shape and param.requires_grad:
                param.register_hook(_keep_strides_of(param))


def _keep_strides_of(param: nn.Parameter) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gradient hook for a weight with a dimension of size 1 (a 1-channel convolution, a linear layer to one
    logit): autograd takes a gradient whose strides differ from the weight's only on that dimension (the same
    bytes in the same order), as a double backward (R1, GP) gives it; DDP's bucket view has the weight's
    strides, and would warn ("Grad strides do not match") and copy that gradient every step. The hook gives such
    a gradient the weight's strides, without a copy; any other layout passes unchanged."""
    formats = (torch.contiguous_format, torch.channels_last) if param.dim() == 4 else (torch.contiguous_format,)

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if grad.stride() != param.stride() and grad.shape == param.shape and any(
                grad.is_contiguous(memory_format=f) and param.is_contiguous(memory_format=f) for f in formats):
            return grad.as_strided(param.shape, param.stride())
        return grad
    return hook


def training_views(networks: Mapping[str, Any], config: TrainConfig) -> dict[str, Any]:
    """The modules the phase runner trains through: compiled G and D with ``config.compile``, else the prepared ones."""
    if not config.compile:
        return dict(networks)
    return {name: torch.compile(net) if name in COMPILED_NETWORKS else net for name, net in networks.items()}


def eager_module(net: Any) -> Any:
    """The module a compiled view wraps (the module itself when it is not compiled)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was compiled
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return net._orig_mod if optimized is not None and isinstance(net, optimized) else net


KEPT_BYTES = 1 << 30  # blocks below this come from the heap and stay there when freed
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory(config: TrainConfig, say: Callable[[str], None]) -> bool:
    """With ``config.keep_freed_memory``, make glibc keep freed memory; True if applied, else one line and False."""
    if not config.keep_freed_memory:
        return False
    mallopt = _glibc_mallopt()
    if mallopt is None:
        say("gan_accel: keep_freed_memory needs Linux with glibc (its mallopt); ignored on this system")
        return False
    if not (mallopt(_M_MMAP_THRESHOLD, KEPT_BYTES) and mallopt(_M_TRIM_THRESHOLD, KEPT_BYTES)):
        say("gan_accel: keep_freed_memory: glibc's mallopt refused the thresholds; ignored")
        return False
    return True


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only (musl has mallopt as a no-op stub)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt
