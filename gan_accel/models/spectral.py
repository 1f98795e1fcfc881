"""Spectral normalisation (Miyato et al., 2018) with one power iteration per *weight update*.

Why not torch's ``spectral_norm``: it iterates on *every* training-mode forward, so k accumulated
micro-batches normalise by another sigma than one batch k times larger (accumulation stops being exact),
and an extra forward changes the run. Here buffer ``sn_fresh`` says whether u, v belong to the current
weight: every ``torch.optim`` step clears it (a global step post-hook: a fused Adam step does not even
bump a tensor's version); the forward-pre-hook (:func:`install_spectral_refresh`, one graph break under
``torch.compile``) keeps a new iteration only where it is clear, with ``torch.where`` (no sync). Being a
buffer, the flag is saved and restored with u, v. u, v and sigma are computed outside autocast: a bf16 estimate would be off by ~0.4%.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

INIT_ITERATIONS = 15  # at construction, so the first forward already divides by a good estimate
_EPS = 1e-12


class SpectralNormMixin:
    """Gives a layer with a ``weight`` (the class after it in the bases) :meth:`normalized_weight`."""

    weight: nn.Parameter

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rows, cols = self._matrix().shape
        self.register_buffer("sn_u", F.normalize(torch.randn(rows, dtype=self.weight.dtype), dim=0, eps=_EPS))
        self.register_buffer("sn_v", F.normalize(torch.randn(cols, dtype=self.weight.dtype), dim=0, eps=_EPS))
        self.register_buffer("sn_fresh", torch.ones((), dtype=torch.bool))
        _watch_optimizer_steps()
        self.reset_estimate()

    def _matrix(self) -> Tensor:
        """The weight as a matrix (rows = output features): conv kernels flattened per output channel."""
        return self.weight.flatten(1)

    def _own_weight(self) -> None:
        # The optimizer hook finds the layer from its weight. Done again at every refresh because a deep
        # copy or a parameter swap gives the layer a new Parameter object.
        key = id(self.weight)
        owner = _OWNERS.get(key)
        if owner is None or owner() is not self:
            _OWNERS[key] = weakref.ref(self, lambda ref, key=key: _OWNERS.pop(key, None) if _OWNERS.get(key) is ref
                                       else None)

    def _iterate(self) -> tuple[Tensor, Tensor]:
        """One power iteration from the stored u: (u, v), not stored."""
        w = self._matrix().detach()
        with torch.autocast(w.device.type, enabled=False):
            v = F.normalize(w.t() @ self.sn_u, dim=0, eps=_EPS)
            return F.normalize(w @ v, dim=0, eps=_EPS), v

    @torch.no_grad()
    def reset_estimate(self, iterations: int = INIT_ITERATIONS) -> None:
        """Re-estimate u, v from the current weight with ``iterations`` power iterations (after an init)."""
        self._own_weight()
        for _ in range(iterations):
            u, v = self._iterate()
            self.sn_u.copy_(u)
            self.sn_v.copy_(v)
        self.sn_fresh.fill_(True)

    @torch.no_grad()
    def refresh(self) -> None:
        """One power iteration if the weight changed since the last one (decided on the device)."""
        self._own_weight()
        u, v = self._iterate()
        self.sn_u.copy_(torch.where(self.sn_fresh, self.sn_u, u))
        self.sn_v.copy_(torch.where(self.sn_fresh, self.sn_v, v))
        self.sn_fresh.fill_(True)

    def sigma(self) -> Tensor:
        """``u^T W v``: differentiable in W (u, v are constants), in the weight's dtype, never autocast."""
        w = self._matrix()
        with torch.autocast(w.device.type, enabled=False):
            # clones: a later refresh updates the buffers in place, which must not alter a saved graph
            return torch.dot(self.sn_u.clone(), w @ self.sn_v.clone())

    def normalized_weight(self) -> Tensor:
        return self.weight / self.sigma()


# id(weight) -> the layer that normalises it (weakly: the registry keeps no layer alive). Not an attribute
# of the Parameter: that would make the weight unpicklable, and a deep copy would not carry it anyway.
_OWNERS: dict[int, "weakref.ref[SpectralNormMixin]"] = {}


@functools.cache  # once per process
def _watch_optimizer_steps() -> None:
    """Register the hook that marks spectrally normalised weights stale after a step."""
    register_optimizer_step_post_hook(_mark_stepped_weights)


def _mark_stepped_weights(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            owner = _OWNERS.get(id(param))
            layer = owner() if owner is not None else None
            if layer is not None and layer.weight is param:
                layer.sn_fresh.fill_(False)


class SNConv2d(SpectralNormMixin, nn.Conv2d):
    """``nn.Conv2d`` whose kernel is spectrally normalised (the kernel as an (out, in*kh*kw) matrix)."""

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.normalized_weight(), self.bias)


class SNLinear(SpectralNormMixin, nn.Linear):
    """``nn.Linear`` with a spectrally normalised weight."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.normalized_weight(), self.bias)


class SNEmbedding(SpectralNormMixin, nn.Embedding):
    """``nn.Embedding`` with a spectrally normalised table (as BigGAN's projection discriminator has)."""

    def forward(self, y: Tensor) -> Tensor:
        return F.embedding(y, self.normalized_weight())


def reset_spectral_norm(module: nn.Module) -> None:
    """Re-estimate u, v of every spectrally normalised layer from scratch (after re-initialising weights)."""
    for layer in module.modules():
        if isinstance(layer, SpectralNormMixin):
            layer.reset_estimate()


def refresh_spectral_norms(module: nn.Module, args: Any = None) -> None:
    """Forward-pre-hook: in training mode, one power iteration for each layer whose weight was updated."""
    if module.training:
        for layer in module.modules():
            if isinstance(layer, SpectralNormMixin):
                layer.refresh()


@functools.cache
def _uncompiled_refresh() -> Any:
    """The hook, left out of torch.compile's graphs. Wrapped on first use, not at import: wrapping imports
    torch._dynamo, which costs every process that imports gan_accel about a second."""
    return torch.compiler.disable(refresh_spectral_norms)


def install_spectral_refresh(module: nn.Module) -> None:
    """Refresh the spectral norms of ``module``'s layers at the start of each of its forwards."""
    module.register_forward_pre_hook(_uncompiled_refresh())
