"""A skipped update puts back the networks' buffers too: what the phase's forward passes changed.

The divergence guard skips an update whose loss or gradients are not finite, and the optimizer state
is left alone (engine/skip_step.py). But the forward passes of that phase have already run, in
training mode: a BatchNorm layer updated its running statistics from the batch, so one NaN pixel
left D's ``running_mean`` NaN for good, every later logit NaN, every later update skipped and every
checkpoint refused. So the runner copies every buffer of every network at the start of a phase
(:meth:`BufferRestore.save`) and puts them back when the update is skipped: the networks are then
exactly as if the phase had not run (BatchNorm statistics, their ``num_batches_tracked``, the power
iteration of a spectral norm, any buffer a custom module keeps).

Cost: a BatchNorm network's buffers are a few kilobytes; the copy is one ``_foreach_copy_`` into
tensors allocated once. A skip read on the host copies them back with one more. A skip decided on
the device (the flag is a device tensor: no host read) puts them back with a ``torch.where`` per
dtype on one flat copy of the buffers (one ``cat``, one ``where``, one ``_foreach_copy_``): a few
kernels, no sync. Networks without buffers cost nothing.

A G forward made ahead for a following G phase (the runner's "G forward once", made while drawing the
D phase's data) belongs to that G phase: a skipped D update leaves G's buffers alone (its graph holds
them until G's backward), a skipped G update takes that forward's change back
(:meth:`BufferRestore.save_hoisted` holds G's buffers from before it).
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn


class BufferRestore:
    """Copies of every buffer of ``nets``, taken at a phase's start and put back on a skip.

    The copies are bytes: every buffer is viewed as ``uint8`` (a view of its own storage, made once),
    so one flat byte tensor per device holds them all, whatever their dtypes (float statistics, integer
    counters, boolean flags), and a select of bytes puts back exactly what was there, NaN or not.
    """

    def __init__(self, nets: Mapping[str, nn.Module], hoisted: str = "G") -> None:
        seen: set[int] = set()
        buffers: list[tuple[str, torch.Tensor]] = []
        for name, net in nets.items():
            for buffer in net.buffers():
                # A non-contiguous buffer has no flat view of its storage: contiguous() would copy it, and
                # writes to the copy would not reach the buffer. Rare (BatchNorm's are contiguous); left out.
                if id(buffer) not in seen and buffer.is_contiguous():
                    seen.add(id(buffer))
                    buffers.append((name, buffer))
        self.active = bool(buffers)
        self._devices: list[_DeviceBytes] = []
        by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
        for name, buffer in buffers:
            by_device.setdefault(buffer.device, []).append((name, buffer))
        for device_buffers in by_device.values():
            self._devices.append(_DeviceBytes(device_buffers, hoisted))
        self._hoist_pending = False

    def save(self, uses_hoisted_forward: bool = False) -> None:
        """Copy every buffer (at a phase's start). ``uses_hoisted_forward``: this phase owns a G forward
        made ahead (after :meth:`save_hoisted`): G's copies are those from before it."""
        if not self.active:
            return
        for part in self._devices:
            torch._foreach_copy_(part.saved, part.buffers)
        if uses_hoisted_forward and self._hoist_pending:
            for part in self._devices:
                if part.hoisted:
                    torch._foreach_copy_(part.hoisted_slots, part.before_hoist)
            self._hoist_pending = False

    def save_hoisted(self) -> None:
        """Before G's forward is made ahead for the next G phase: keep G's buffers as they are."""
        self._hoist_pending = False
        for part in self._devices:
            if part.hoisted:
                torch._foreach_copy_(part.before_hoist, part.hoisted)
                self._hoist_pending = True

    def drop_hoisted(self) -> None:
        """New data is drawn: a G forward made ahead earlier belongs to no coming phase."""
        self._hoist_pending = False

    def restore(self) -> None:
        """Put every buffer back (a skip read on the host)."""
        keep_hoisted = self._hoist_pending
        for part in self._devices:
            n = part.own_count if keep_hoisted else len(part.buffers)
            torch._foreach_copy_(part.buffers[:n], part.saved[:n])

    def restore_where(self, flag: torch.Tensor) -> None:
        """Put every buffer back where ``flag`` (a 0-dim device tensor, 1.0 = skipped) is set; no host read."""
        keep_hoisted = self._hoist_pending
        for part in self._devices:
            # preallocated: the buffers' bytes now (one cat), the select into them, the copy back
            buffers, current, flat, views = part.own if keep_hoisted else part.every
            if not buffers:
                continue
            torch.cat(buffers, out=current)
            torch.where(flag.to(flat.device) > 0, flat, current, out=current)
            torch._foreach_copy_(buffers, views)


class _DeviceBytes:
    """The buffers on one device as flat ``uint8`` views, and their copies in one flat tensor.

    G's buffers come last: while G's forward made ahead waits for its phase, its autograd graph holds G's
    BatchNorm statistics, and writing them (even the same bytes) would make that phase's backward fail;
    a restore then stops before them (their change belongs to G's phase anyway)."""

    def __init__(self, buffers: list[tuple[str, torch.Tensor]], hoisted: str) -> None:
        ordered = [b for name, b in buffers if name != hoisted] + [b for name, b in buffers if name == hoisted]
        self.own_count = sum(1 for name, _ in buffers if name != hoisted)
        self.buffers = [_bytes(b) for b in ordered]
        self.sizes = [b.numel() for b in self.buffers]
        self.own_bytes = sum(self.sizes[:self.own_count])
        self.flat = torch.empty(sum(self.sizes), dtype=torch.uint8, device=ordered[0].device)
        self.saved = list(self.flat.split(self.sizes))
        self.hoisted = self.buffers[self.own_count:]
        self.hoisted_slots = self.saved[self.own_count:]
        self.before_hoist = [torch.empty_like(b) for b in self.hoisted]
        current = torch.empty_like(self.flat)
        views = list(current.split(self.sizes))
        own = self.own_count
        self.every = (self.buffers, current, self.flat, views)
        self.own = (self.buffers[:own], current[:self.own_bytes], self.flat[:self.own_bytes], views[:own])


def _bytes(buffer: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of ``buffer``'s storage (writes through it change the buffer)."""
    return buffer.detach().reshape(-1).view(torch.uint8)
