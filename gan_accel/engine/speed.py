"""Opt-in speed options applied while a run is built: channels-last memory format, torch.compile, and
glibc's allocator keeping freed memory.

All three are off by default: ``benchmarks/run.py`` measures them against the eager default on the
machine at hand, and none helps everywhere (see docs/benchmarks.md).

* ``channels_last``: the networks' 4-D weights are converted to the channels-last memory format
  before ``prepare`` (the parameters stay the same objects, so optimizers built by the user still
  hold them); convolutions then produce channels-last activations. Networks without 4-D weights
  (an MLP) are unchanged.
* ``compile``: G and D are compiled with ``torch.compile`` *after* ``prepare`` (after the DDP wrap,
  as Accelerate's own dynamo option does). Only the phase runner trains through the compiled
  views; the trainer's ``networks`` stay the eager prepared modules (checkpoints, EMA, sampling and
  evaluation are unchanged). torch.compile does not support a double backward, so a phase marked
  ``double_backward=True`` (R1, the gradient penalty) calls the eager modules (see
  :class:`~gan_accel.engine.context.StepContext`); both share the same parameters.
* ``keep_freed_memory``: on Linux with glibc, ``mallopt`` raises the mmap and trim thresholds to
  1 GiB, as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` would. By default glibc serves
  large blocks (a CPU step's activations) with ``mmap`` and returns them when freed, so every step
  page-faults them back in, zero-filled, inside the convolutions. Process-wide and for the rest of the
  process: the memory of the largest step stays with it. The arithmetic is unchanged.
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


def accelerator_compiles(accelerator: Accelerator) -> str | None:
    """The dynamo backend Accelerate's own ``prepare`` compiles models with, or None."""
    plugin = getattr(accelerator.state, "dynamo_plugin", None)
    backend = getattr(plugin, "backend", None)
    name = getattr(backend, "value", backend)
    return None if name in (None, "NO", "no") else str(name)


def check_speed_options(accelerator: Accelerator, config: TrainConfig, plan: PhasePlan) -> None:
    """Refuse, before anything is prepared, a compile setting that cannot train.

    Accelerate's ``dynamo_backend`` compiles every prepared model, with no eager path for a double
    backward; ``compile=True`` on top of it would compile twice.
    """
    backend = accelerator_compiles(accelerator)
    if backend is None:
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
    """Channels-last weights for every network when ``config.channels_last`` (in place, before prepare)."""
    if not config.channels_last:
        return
    for net in nets.values():
        net.to(memory_format=torch.channels_last)


def training_views(networks: Mapping[str, Any], config: TrainConfig) -> dict[str, Any]:
    """The modules the phase runner trains through: compiled G and D with ``config.compile``, else the
    prepared modules themselves. A compiled view wraps the prepared module and shares its parameters."""
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
    """With ``config.keep_freed_memory``, make glibc keep freed memory in the process (see the module
    doc). True if applied; elsewhere (not glibc, or mallopt refused) one line through ``say`` and False."""
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
