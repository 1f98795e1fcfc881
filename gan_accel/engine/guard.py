"""The divergence guard: an update whose loss or gradients are not finite is skipped, on the device.

The verdict is a 0-dim float32 tensor, 1.0 = skip (the ``found_inf`` convention of GradScaler and fused
optimizers), agreed by all ranks and never read by the host in a step: a host read would wait for the
queued kernels once per update. The counters are read at log rows and checkpoints
(:meth:`DivergenceGuard.check`), so no checkpoint holds non-finite weights. Under fp16 the GradScaler
already skips inf/NaN gradients, so the guard checks only the loss and hands a bad one to the scaler.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn

from ..errors import DivergenceError

_ONES: dict[torch.device, torch.Tensor] = {}


def non_finite_flag(tensors: Iterable[torch.Tensor], found: torch.Tensor | None = None) -> torch.Tensor:
    """1.0 if any of ``tensors`` holds a NaN or inf, else 0.0 (0-dim, no sync); ``found`` is raised, never lowered.

    The GradScaler's fused kernel ("unscaling" by 1): a per-tensor norm cost several percent of a CPU step."""
    groups: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.device, []).append(tensor)
    for device, group in groups.items():  # one device, one kernel call, in the usual case
        if device not in _ONES:
            _ONES[device] = torch.ones((), device=device)
        if found is None:
            found = torch.zeros((), device=device)
        part = found if found.device == device else torch.zeros((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, part, _ONES[device])
        if part is not found:
            torch.maximum(found, part.to(found.device, non_blocking=True), out=found)
    return found


class DivergenceGuard:
    """Decides the verdict on each update and counts the skips per network."""

    def __init__(self, max_consecutive: int, networks: tuple[str, ...] = ("G", "D"),
                 say: Callable[[str], None] | None = None, resume_note: Callable[[], str] | None = None) -> None:
        self.max_consecutive = max_consecutive
        self.say = say  # prints the skips found at a check (accelerator.print: main process only)
        self.resume_note = resume_note  # the checkpoint to resume from, in words (the trainer's), for the error
        self._reported: dict[str, int] = {}
        # Per network [consecutive skips now, all skips, longest run since the last check]; they move to
        # the verdicts' device at the first one. The longest run is kept so that a run of skips that ended
        # before a check still raises at it.
        self._counts = {name: torch.zeros(3) for name in networks}
        self._views = {name: counts.unbind() for name, counts in self._counts.items()}
        self._bad_data: torch.Tensor | None = None  # raised by a real batch holding NaN/inf since the last check
        self.bad_data_seen = False

    def verdict(self, name: str, loss: torch.Tensor, grads: list[torch.Tensor],
                reals: Iterable[torch.Tensor] = ()) -> torch.Tensor:
        """The verdict on ``name``'s update (1.0 = skip) from ``loss`` and ``grads``, agreed and counted, no sync.
        ``reals``: the window's new real batches (whether the data itself held NaN/inf, for the messages)."""
        flag = non_finite_flag([loss.detach().reshape(1).float(), *grads])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # a local NaN loss must skip the update on every rank alike
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        counts = self._counts[name]
        if counts.device != flag.device:  # the first verdict: the counters move to its device
            self._place(name, counts, flag.device)
        consecutive, skipped, longest = self._views[name]
        consecutive.add_(1).mul_(flag)  # +1 on a skip, back to 0 on an update (exact: small integers)
        skipped.add_(flag)
        torch.maximum(longest, consecutive, out=longest)
        reals = [r for r in reals if r.is_floating_point()]
        if reals:
            with torch.no_grad():
                self._bad_data = non_finite_flag(reals, self._bad_data)
        return flag

    def _place(self, name: str, counts: torch.Tensor | list[int], device: torch.device) -> None:
        self._counts[name] = torch.as_tensor(counts, dtype=torch.float32).to(device)
        self._views[name] = self._counts[name].unbind()

    def _read(self) -> dict[str, list[int]]:
        """The counters on the host, ``{name: [consecutive, skipped, longest]}`` (one sync)."""
        names = list(self._counts)
        if not names:
            return {}
        device = self._counts[names[0]].device
        rows = torch.stack([self._counts[n].to(device) for n in names]).tolist()
        return {name: [int(v) for v in row] for name, row in zip(names, rows)}

    @property
    def skipped(self) -> dict[str, int]:
        """Skipped updates per network so far (reads the device: call at log intervals)."""
        return {name: row[1] for name, row in self._read().items()}

    def data_note(self) -> str:
        """What the guard saw of non-finite real data (for messages); '' if nothing."""
        if self._bad_data is not None and bool(self._bad_data):
            self.bad_data_seen = True
        return ("the real batches held NaN/inf values: the data, not the training, made them non-finite"
                if self.bad_data_seen else "")

    def check(self, step: int) -> dict[str, int]:
        """Raise :class:`DivergenceError` past ``max_consecutive`` skips in a row since the last check, else
        return ``{"skipped/<net>": count}``. Reads the device; call on every rank alike."""
        counts = self._read()
        data = self.data_note()
        for name, (_, skipped, _) in counts.items():
            if skipped > self._reported.get(name, 0) and self.say is not None:
                self.say(f"gan_accel: {skipped - self._reported.get(name, 0)} update(s) of {name} with a non-finite "
                         f"loss or gradients skipped by step {step}" + (f"; {data}" if data else ""))
            self._reported[name] = skipped
        for name, (_, _, longest) in counts.items():
            if longest >= self.max_consecutive:
                go_on = (f"to go on past them, continue with a larger max_bad_updates (now {self.max_consecutive}; "
                         "--max-bad-updates N): the guard skips each such update and the run continues")
                where = f". {self.resume_note()}" if self.resume_note is not None else ""
                if data:
                    raise DivergenceError(
                        f"{name}'s updates were skipped for {longest} consecutive updates (noticed at step {step}): "
                        f"{data}. No checkpoint holds non-finite weights. Fix or filter the data; or, {go_on}{where}")
                raise DivergenceError(
                    f"{name}'s loss or gradients were non-finite for {longest} consecutive updates (noticed at "
                    f"step {step}); every one was skipped and no checkpoint holds non-finite weights. Lower "
                    f"{name}'s learning rate, enable gradient clipping, or try bf16 instead of fp16, then resume; "
                    f"or, {go_on}{where}")
        for name, (consecutive, _, _) in counts.items():  # the longest run restarts from the current one
            self._views[name][2].fill_(consecutive)
        return {f"skipped/{name}": row[1] for name, row in counts.items()}

    def state_dict(self) -> dict:
        counts = self._read()
        return {"consecutive": {n: c[0] for n, c in counts.items()}, "skipped": {n: c[1] for n, c in counts.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name in set(state["consecutive"]) | set(state["skipped"]):
            consecutive, skipped = int(state["consecutive"].get(name, 0)), int(state["skipped"].get(name, 0))
            device = self._counts[name].device if name in self._counts else torch.device("cpu")
            self._place(name, [consecutive, skipped, consecutive], device)
            self._reported[name] = skipped


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


class SkipStep:
    """``optimizer.step()`` that changes nothing where the verdict is 1.0, without reading it; cheapest first
    (``modes_used`` counts them): ``"scaler"`` (fp16: one gradient made NaN, the GradScaler skips it as an
    overflow), ``"fused"`` (fused Adam/AdamW read ``found_inf`` in ``step()``; fused SGD allocates its
    momentum before deciding, so it takes "restore"), ``"restore"`` (parameters and state copied, then
    selected back with ``torch.where``), ``"read"`` (the verdict read where a select cannot be exact: a first
    step, or state off the verdict's device such as non-capturable Adam's CPU step counter)."""

    def __init__(self, scaler: Any = None) -> None:
        self.scaler = scaler
        self.modes_used: dict[str, int] = {}

    def mark_gradients(self, optimizer: Any, flag: torch.Tensor) -> None:
        """Under fp16: make the GradScaler see the verdict (call before any unscale)."""
        if self.scaler is None:
            return
        grads = [p.grad for g in inner_optimizer(optimizer).param_groups for p in g["params"] if p.grad is not None]
        if grads:  # NaN where the flag is set, + 0.0 elsewhere (the scaler then finds an inf or not)
            grads[0].add_(torch.where(flag.to(grads[0].device) > 0, float("nan"), 0.0).to(grads[0].dtype))

    def step(self, optimizer: Any, flag: torch.Tensor) -> None:
        inner = inner_optimizer(optimizer)
        if self.scaler is not None:
            mode = "scaler"
        elif isinstance(inner, torch.optim.Adam) and all(group.get("fused") for group in inner.param_groups):
            mode = "fused"
        else:
            held = _held_tensors(inner, flag.device)
            mode = "read" if held is None else "restore"
        self.modes_used[mode] = self.modes_used.get(mode, 0) + 1
        if mode == "fused":
            inner.found_inf = flag
            try:
                optimizer.step()
            finally:
                del inner.found_inf
        elif mode == "restore":
            saved = [t.detach().clone() for t in held]
            optimizer.step()
            with torch.no_grad():
                for tensor, before in zip(held, saved):
                    torch.where(flag > 0, before, tensor, out=tensor)
        elif mode == "scaler" or not bool(flag):  # "scaler": mark_gradients has poisoned a gradient if set
            optimizer.step()


def _held_tensors(optimizer: torch.optim.Optimizer, device: torch.device) -> list[torch.Tensor] | None:
    """Every parameter and state tensor ``optimizer`` may change, if all are tensors on ``device`` and the
    state of every parameter with a gradient exists (else None: the step cannot be undone exactly)."""
    held = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state and p.grad is not None:
                return None
            for value in [p, *(state or {}).values()]:
                if not isinstance(value, torch.Tensor) or value.device != device:
                    return None
                held.append(value)
    return held


class BufferRestore:
    """A skipped update puts back every buffer its phase's forwards changed (one NaN pixel would leave
    BatchNorm's running statistics NaN for good): copied at a phase's start, selected back by the verdict.

    The copies are bytes (each buffer viewed as ``uint8``), one flat tensor per device whatever the dtypes.
    A G forward made ahead for a following G phase belongs to that phase: G's buffers come last, a skipped
    D update stops before them (the forward's graph holds them until G's backward; writing them would fail
    it), and a skipped G update puts them back to before that forward (:meth:`save_hoisted`).
    """

    def __init__(self, nets: Mapping[str, nn.Module], hoisted: str = "G") -> None:
        seen: set[int] = set()
        by_device: dict[torch.device, list[tuple[bool, torch.Tensor]]] = {}
        for name, net in nets.items():
            for buffer in net.buffers():
                # a non-contiguous buffer has no flat view of its storage (rare: BatchNorm's are contiguous)
                if id(buffer) not in seen and buffer.is_contiguous():
                    seen.add(id(buffer))
                    by_device.setdefault(buffer.device, []).append((name == hoisted, buffer))
        self._parts = [_Bytes(sorted(buffers, key=lambda item: item[0])) for buffers in by_device.values()]
        self._hoist_pending = False

    def save(self, uses_hoisted_forward: bool = False) -> None:
        """Copy every buffer (at a phase's start). ``uses_hoisted_forward``: this phase owns a G forward
        made ahead (after :meth:`save_hoisted`): G's copies are those from before it."""
        for part in self._parts:
            torch._foreach_copy_(part.saved, part.buffers)
            if uses_hoisted_forward and self._hoist_pending and part.before_hoist:
                torch._foreach_copy_(part.saved[part.own:], part.before_hoist)
        if uses_hoisted_forward:
            self._hoist_pending = False

    def save_hoisted(self, hoisting: bool) -> None:
        """New data is drawn; ``hoisting``: G's forward is made ahead for the next G phase, G's buffers kept."""
        self._hoist_pending = hoisting
        for part in self._parts if hoisting else ():
            if part.before_hoist:  # an empty list is an error for _foreach_copy_ (no G buffer on this device)
                torch._foreach_copy_(part.before_hoist, part.buffers[part.own:])

    def restore_where(self, flag: torch.Tensor) -> None:
        """Put every buffer back where ``flag`` (1.0 = skipped) is set; no host read."""
        for part in self._parts:
            buffers, current, saved, views = part.own_part if self._hoist_pending else part.every
            if buffers:  # the buffers' bytes now (one cat), the select into them, the copy back
                torch.cat(buffers, out=current)
                torch.where(flag.to(current.device) > 0, saved, current, out=current)
                torch._foreach_copy_(buffers, views)


class _Bytes:
    """The buffers on one device (``(is G's, buffer)``, G's last) as flat ``uint8`` views, and their copies."""

    def __init__(self, buffers: list[tuple[bool, torch.Tensor]]) -> None:
        self.own = n = sum(1 for hoisted, _ in buffers if not hoisted)
        self.buffers = [b.detach().reshape(-1).view(torch.uint8) for _, b in buffers]  # writes reach the buffers
        sizes = [b.numel() for b in self.buffers]
        flat = torch.empty(sum(sizes), dtype=torch.uint8, device=self.buffers[0].device)
        current = torch.empty_like(flat)
        self.saved, views = list(flat.split(sizes)), list(current.split(sizes))
        self.before_hoist = [torch.empty_like(b) for b in self.buffers[n:]]
        self.every = (self.buffers, current, flat, views)
        own = sum(sizes[:n])
        self.own_part = (self.buffers[:n], current[:own], flat[:own], views[:n])


class Fp16Skips:
    """Counts the updates the fp16 GradScaler skipped, per network, without reading the device: the scale
    drops exactly when an update overflowed (Accelerate's ``step_was_skipped`` misses fused optimizers)."""

    def __init__(self, scaler: Any, names: Iterable[str]) -> None:
        self.scaler = scaler if scaler is not None and getattr(scaler, "is_enabled", lambda: True)() else None
        self._counts: dict[str, Any] = {name: 0 for name in names}

    def before(self) -> torch.Tensor | None:
        """The scale ahead of an update (a device copy), or None without a scaler."""
        return None if self.scaler is None or self.scaler._scale is None else self.scaler._scale.detach().clone()

    def after(self, name: str, before: torch.Tensor | None) -> None:
        if before is not None:
            self._counts[name] = self._counts.get(name, 0) + (self.scaler._scale < before).to(torch.int64)

    def metrics(self) -> dict[str, int]:
        """``{"skipped_fp16/<net>": count}`` since the run started (a host read); empty without a scaler."""
        return {f"skipped_fp16/{name}": int(count) for name, count in self._counts.items()} if self.scaler else {}

    def state_dict(self) -> dict[str, int]:
        return {name: int(count) for name, count in self._counts.items()}

    def load_state_dict(self, state: dict[str, int] | None) -> None:
        self._counts.update({name: int(count) for name, count in (state or {}).items()})
