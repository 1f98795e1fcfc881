"""Divergence guard: skip updates whose loss or gradients are not finite, stop after too many.

Nothing here waits for the device in the hot path. The verdict on an update is a device tensor
(``non_finite_flag``: 1.0 = skip), agreed by all ranks on the device (see the runner), and handed
to the optimizer step by :mod:`gan_accel.engine.skip_step`, which skips the update on the device
where it can. The counters are device tensors too: the host reads them only at log rows, before a
checkpoint and at the end of ``fit`` (:meth:`DivergenceGuard.check`), where the trainer reads its
metrics anyway. So :class:`~gan_accel.errors.DivergenceError` is raised at the first such check
after the ``max_bad_updates``-th consecutive skip, not at that very step; every skipped update
left the weights untouched, so no checkpoint ever holds non-finite weights (a check comes first).

Under fp16 the GradScaler already skips steps with inf/NaN gradients (scaled gradients overflow
routinely while it searches for its scale), so there the guard checks only the loss.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import DivergenceError

_ONES: dict[torch.device, torch.Tensor] = {}


def non_finite_flag(model: nn.Module, loss_sum: torch.Tensor, check_grads: bool) -> torch.Tensor:
    """A 0-dim float32 tensor on the loss's device, no sync: 1.0 if ``loss_sum`` (or, if asked, a gradient)
    is not finite, else 0.0 (the ``found_inf`` convention of torch's GradScaler and fused optimizers).

    One fused pass over the gradients and the loss with the kernel the GradScaler uses (unscaling by
    1 leaves them unchanged): measured side by side, a per-tensor norm cost several percent of a small
    DCGAN's CPU step, this kernel about nothing.
    """
    groups: dict[torch.device, list[torch.Tensor]] = {loss_sum.device: [loss_sum.detach().reshape(1).float()]}
    if check_grads:
        for p in model.parameters():
            if p.grad is not None:
                groups.setdefault(p.grad.device, []).append(p.grad)
    flag = None
    for device, tensors in groups.items():
        one = _ONES.get(device)
        if one is None:
            one = _ONES[device] = torch.ones((), device=device)
        found = torch.zeros((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, one)
        flag = found if flag is None else torch.maximum(flag, found.to(flag.device, non_blocking=True))
    return flag


class DivergenceGuard:
    """Counts skipped updates per network on the device; :meth:`check` raises past ``max_consecutive``.

    :meth:`record` is called once per optimizer step with the agreed flag and never syncs. The host
    reads the counters at :meth:`check` (log rows, checkpoints, end of ``fit``), so the error comes at
    the first check after the ``max_consecutive``-th consecutive skip. A run of that many skips that
    ended before the check still raises (the longest run since the last check is kept).
    """

    def __init__(self, max_consecutive: int, networks: tuple[str, ...] = ("G", "D"),
                 say: Callable[[str], None] | None = None) -> None:
        self.max_consecutive = max_consecutive
        self.networks = tuple(networks)
        self.say = say  # prints the skips found at a check (accelerator.print: main process only)
        self._reported: dict[str, int] = {}
        # Per network, on the device once training starts: consecutive skips now, all skips, longest run.
        self._counts = {name: torch.zeros(3) for name in self.networks}
        self._views = {name: counts.unbind() for name, counts in self._counts.items()}

    def record(self, name: str, flag: torch.Tensor) -> None:
        """Count one update of ``name``; ``flag`` is its 0-dim verdict (1.0 = skipped). No host sync."""
        counts = self._counts.get(name)
        if counts is None or counts.device != flag.device:  # first update: the counters move to the device
            self._set(name, counts if counts is not None else torch.zeros(3), flag.device)
        consecutive, skipped, longest = self._views[name]
        consecutive.add_(1).mul_(flag)  # +1 on a skip, back to 0 on an update (exact: small integers)
        skipped.add_(flag)
        torch.maximum(longest, consecutive, out=longest)

    def _read(self) -> dict[str, list[int]]:
        """The counters on the host: ``{name: [consecutive, skipped, longest]}`` (one device sync)."""
        names = list(self._counts)
        device = self._counts[names[0]].device
        values = torch.stack([self._counts[n].to(device) for n in names]).tolist()
        return {name: [int(v) for v in row] for name, row in zip(names, values)}

    @property
    def skipped(self) -> dict[str, int]:
        """Skipped updates per network so far (reads the device: call at log intervals)."""
        return {name: row[1] for name, row in self._read().items()}

    def check(self, step: int) -> dict[str, int]:
        """Raise :class:`DivergenceError` if a network skipped ``max_consecutive`` updates in a row since
        the last check; else return the metrics ``{"skipped/<net>": count}``. Reads the device: call at
        log rows and checkpoints, on every rank alike (the flags, hence the counters, are agreed)."""
        counts = self._read()
        for name, (_, skipped, _) in counts.items():
            if skipped > self._reported.get(name, 0) and self.say is not None:
                self.say(f"gan_accel: {skipped - self._reported.get(name, 0)} update(s) of {name} with a non-finite "
                         f"loss or gradients skipped by step {step}")
            self._reported[name] = skipped
        for name, (_, _, longest) in counts.items():
            if longest >= self.max_consecutive:
                raise DivergenceError(
                    f"{name}'s loss or gradients were non-finite for {longest} consecutive updates (noticed at "
                    f"step {step}); every one was skipped and no checkpoint holds non-finite weights. Lower "
                    f"{name}'s learning rate, enable gradient clipping, or try bf16 instead of fp16, then resume "
                    "from the last checkpoint (resume='latest')"
                )
        for name, (consecutive, _, _) in counts.items():  # the longest run restarts from the current one
            self._views[name][2].fill_(consecutive)
        return {f"skipped/{name}": row[1] for name, row in counts.items()}

    def state_dict(self) -> dict:
        counts = self._read()
        return {"consecutive": {n: c[0] for n, c in counts.items()}, "skipped": {n: c[1] for n, c in counts.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name in set(state["consecutive"]) | set(state["skipped"]):
            consecutive, skipped = state["consecutive"].get(name, 0), state["skipped"].get(name, 0)
            device = self._counts[name].device if name in self._counts else torch.device("cpu")
            self._set(name, torch.tensor([consecutive, skipped, consecutive], dtype=torch.float32), device)
            self._reported[name] = skipped

    def _set(self, name: str, counts: torch.Tensor, device: torch.device) -> None:
        self._counts[name] = counts.to(device)
        self._views[name] = self._counts[name].unbind()
