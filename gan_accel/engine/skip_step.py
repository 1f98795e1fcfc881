"""One optimizer step that is skipped, on the device, when the divergence guard's flag says so.

The flag is a 0-dim float32 device tensor, 1.0 = skip (agreed by every rank before this point).
How the skip is applied depends on the optimizer, cheapest first:

* ``"scaler"`` (fp16, Accelerate's GradScaler present): the guard checks the loss only; a non-finite
  loss makes one gradient NaN (``grad += where(flag, nan, 0)``) before the scaler unscales, so the
  scaler skips the step as it skips any overflow (and lowers its scale, which a non-finite loss
  under fp16 usually calls for). No extra sync: the scaler's own is all there is.
* ``"fused"``: torch's fused Adam/AdamW (``fused=True``, gan_accel's default optimizer) read
  ``optimizer.found_inf`` in ``step()``: with 1.0 their kernel leaves parameters and moments alone
  and the step counters are put back (torch/optim/adam.py, ``_fused_adam``; the contract
  ``GradScaler.step`` uses for optimizers with ``_step_supports_amp_scaling``). No sync, no extra
  work. Fused SGD is not used this way: on its first step with momentum it allocates its buffers
  uninitialised before the kernel decides to skip.
* ``"restore"``: any other optimizer whose state already lives on the flag's device: parameters and
  state tensors are copied before ``step()`` and put back with ``torch.where`` after it when the
  flag is set. Exact (a select, no arithmetic), no sync, costs one copy of the optimizer's tensors.
* ``"host"``: the flag is read on the host, ``step()`` is called only when it is 0. Used for every
  optimizer on CPU, where reading a CPU tensor waits for nothing (CPU kernels run synchronously): an
  ``if`` is cheaper there than ``found_inf`` (one more foreach kernel on the step counters) or a copy,
  measured ~20 us an update on a 2-core CPU, 0.4% of a small MLP GAN's step. Also used where
  ``"restore"`` cannot be exact: an optimizer's first step (its state does not exist
  yet), state that is not a tensor, or state on another device than the flag (the default,
  non-capturable ``torch.optim.Adam`` keeps its step counter on the CPU even on CUDA).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

SKIP_MODES = ("scaler", "fused", "restore", "host")


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def supports_found_inf(optimizer: Any) -> bool:
    """Whether ``step()`` honours ``optimizer.found_inf`` exactly: torch's fused Adam and AdamW."""
    inner = inner_optimizer(optimizer)
    return isinstance(inner, torch.optim.Adam) and all(group.get("fused") for group in inner.param_groups)


class SkippableStep:
    """Calls ``optimizer.step()`` so that a set flag leaves parameters and optimizer state unchanged.

    ``cpu_mode``: ``"host"`` (default, the cheapest on a CPU: the runner reads the flag there) or
    ``"device"`` (a CPU run takes the path a GPU takes, "fused" or "restore"; the tests use it to prove
    those paths, and that they read nothing back, on CPU).
    """

    def __init__(self, scaler: Any = None, cpu_mode: str = "host") -> None:
        self.scaler = scaler
        self.cpu_mode = cpu_mode
        self.modes_used: dict[str, int] = {}  # how often each mode ran (for tests and curiosity)

    def reads_on_host(self, flag: torch.Tensor) -> bool:
        """Whether the runner reads this verdict on the host (then passes a bool to :meth:`step` and the guard)."""
        return self.scaler is None and self.cpu_mode == "host" and flag.device.type == "cpu"

    def mark_gradients(self, optimizer: Any, flag: torch.Tensor) -> None:
        """Under fp16: make the scaler see the guard's verdict (call before any unscale)."""
        if self.scaler is None:
            return
        grads = [p.grad for g in inner_optimizer(optimizer).param_groups for p in g["params"] if p.grad is not None]
        if grads:  # NaN where the flag is set, + 0.0 elsewhere (the scaler then finds an inf or not)
            grads[0].add_(torch.where(flag.to(grads[0].device) > 0, float("nan"), 0.0).to(grads[0].dtype))

    def step(self, optimizer: Any, flag: torch.Tensor | bool) -> None:
        """``optimizer.step()``, skipped on the device when ``flag`` is 1.0 (on the host when it is a bool)."""
        if isinstance(flag, bool):  # already read on the host (reads_on_host)
            self.modes_used["host"] = self.modes_used.get("host", 0) + 1
            if not flag:
                optimizer.step()
            return
        mode, held = self._mode(optimizer, flag)
        self.modes_used[mode] = self.modes_used.get(mode, 0) + 1
        if mode == "scaler":
            optimizer.step()  # mark_gradients has poisoned a gradient if the flag is set
        elif mode == "fused":
            inner = inner_optimizer(optimizer)
            inner.found_inf = flag
            try:
                optimizer.step()
            finally:
                del inner.found_inf
        elif mode == "restore":
            _step_then_restore(optimizer, flag, held)
        elif not bool(flag):  # "host"
            optimizer.step()

    def _mode(self, optimizer: Any, flag: torch.Tensor) -> tuple[str, list[torch.Tensor] | None]:
        """The mode for this step (and, for "restore", the tensors to restore)."""
        if self.scaler is not None:
            return "scaler", None
        if flag.device.type == "cpu" and self.cpu_mode == "host":
            return "host", None
        if supports_found_inf(optimizer):
            return "fused", None
        held = _held_tensors(inner_optimizer(optimizer), flag.device)
        return ("host", None) if held is None else ("restore", held)


def _held_tensors(optimizer: torch.optim.Optimizer, device: torch.device) -> list[torch.Tensor] | None:
    """Every parameter and state tensor ``optimizer`` may change, if all are tensors on ``device`` and the
    state of every parameter with a gradient exists (else None: the step cannot be undone exactly there)."""
    held = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state and p.grad is not None:
                return None  # its first step creates the state: nothing to restore it to
            for value in [p, *(state or {}).values()]:
                if not isinstance(value, torch.Tensor) or value.device != device:
                    return None
                held.append(value)
    return held


def _step_then_restore(optimizer: Any, flag: torch.Tensor, held: list[torch.Tensor]) -> None:
    """``step()``, then every tensor in ``held`` (all it may change) is put back if ``flag`` is set."""
    saved = [t.detach().clone() for t in held]
    optimizer.step()
    skip = flag.to(torch.bool)
    with torch.no_grad():
        for tensor, before in zip(held, saved):
            torch.where(skip, before, tensor, out=tensor)


def direct_stepper(accelerator: Any, optimizer: Any) -> Any:
    """What the runner calls ``step()``/``zero_grad()`` on: the torch optimizer itself where Accelerate's
    wrapper would add nothing but cost, else the wrapper.

    The runner steps only at the end of an accumulation window (``sync_gradients`` is true), and
    without a GradScaler ``AcceleratedOptimizer.step`` then just calls the inner ``step()`` (XLA aside),
    after two package lookups (``is_lomo_available``: an ``importlib`` search of ``sys.path``, ~0.5 ms
    each on a 2-core CPU, a quarter of a small GAN's step); its ``zero_grad`` inspects the inner
    method's signature on every call. With fp16 (the scaler steps, unscales and detects overflow
    there) or XLA (gradients are reduced there) the wrapper is kept.
    """
    from accelerate.utils import DistributedType

    inner = inner_optimizer(optimizer)
    if inner is optimizer or accelerator.scaler is not None or accelerator.distributed_type == DistributedType.XLA:
        return optimizer
    try:
        accepts_set_to_none = "set_to_none" in inspect.signature(inner.zero_grad).parameters
    except (TypeError, ValueError):
        accepts_set_to_none = False
    return inner if accepts_set_to_none else optimizer
