"""Spectral normalisation (Miyato et al., 2018) with one power iteration per *weight update*.

A layer's weight is divided by an estimate of its largest singular value, ``sigma = u^T W v``, where
``u`` and ``v`` are buffers improved by one power iteration at a time.

Why not ``torch.nn.utils.parametrizations.spectral_norm``: it runs the power iteration on *every*
training-mode forward, so the estimate depends on how many times D was called, not on how many times
it was updated. A D phase run as k accumulated micro-batches then normalises by another sigma than
the same phase on one batch k times larger (accumulation stops being exact), and an extra forward (a
health probe, a lazy-R1 phase) changes the run. Here the estimate is refreshed by one iteration in
the first training-mode forward after an update, the paper's algorithm (one iteration per update).

How: buffer ``sn_fresh`` says whether u, v belong to the current weight. Every ``torch.optim``
optimizer's ``step`` clears it for the weights it holds (a global step post-hook, registered once;
a fused Adam step does not even bump a tensor's version counter, so nothing else would notice), and
so does :func:`mark_spectral_norms_stale`, for weights changed by other means. The network's
forward-pre-hook (:func:`install_spectral_refresh`, excluded from ``torch.compile``: one graph break
at the start of the forward) computes one iteration for every layer and keeps it only where the flag
is clear, with ``torch.where`` on the device: no host read, no sync. Being a buffer, the flag is saved
and loaded with u, v (a resumed run does the iterations the uninterrupted one would have done) and put
back with them by anything that restores buffers (the engine's dry run). An fp16 step the GradScaler
skips is no ``step`` call and leaves the estimate alone.

u, v and sigma are computed outside autocast, in the weight's dtype: under bf16 autocast a bf16
estimate would be off by ~0.4%, and the normalised weight with it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

INIT_ITERATIONS = 15  # at construction, so the first forward already divides by a good estimate
_EPS = 1e-12


class SpectralNormMixin:
    """Gives a layer with a ``weight`` the method :meth:`normalized_weight` (``weight / sigma``).

    Call :meth:`_setup_spectral_norm` at the end of the subclass's ``__init__``.
    """

    weight: nn.Parameter

    def _setup_spectral_norm(self) -> None:
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


_WATCHING = False
# id(weight) -> the layer that normalises it (weakly: the registry keeps no layer alive). Not an attribute
# of the Parameter: that would make the weight unpicklable, and a deep copy would not carry it anyway.
_OWNERS: dict[int, "weakref.ref[SpectralNormMixin]"] = {}


def _watch_optimizer_steps() -> None:
    """Register (once per process) the hook that marks spectrally normalised weights stale after a step."""
    global _WATCHING
    if not _WATCHING:
        register_optimizer_step_post_hook(_mark_stepped_weights)
        _WATCHING = True


def _mark_stepped_weights(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            owner = _OWNERS.get(id(param))
            layer = owner() if owner is not None else None
            if layer is not None and layer.weight is param:
                layer.sn_fresh.fill_(False)


class SNConv2d(SpectralNormMixin, nn.Conv2d):
    """``nn.Conv2d`` whose kernel is spectrally normalised (the kernel as an (out, in*kh*kw) matrix)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setup_spectral_norm()

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.normalized_weight(), self.bias)


class SNLinear(SpectralNormMixin, nn.Linear):
    """``nn.Linear`` with a spectrally normalised weight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setup_spectral_norm()

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.normalized_weight(), self.bias)


class SNEmbedding(SpectralNormMixin, nn.Embedding):
    """``nn.Embedding`` with a spectrally normalised table (as BigGAN's projection discriminator has)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setup_spectral_norm()

    def forward(self, y: Tensor) -> Tensor:
        return F.embedding(y, self.normalized_weight())


def reset_spectral_norm(module: nn.Module) -> None:
    """Re-estimate u, v of every spectrally normalised layer from scratch (after re-initialising weights)."""
    for layer in module.modules():
        if isinstance(layer, SpectralNormMixin):
            layer.reset_estimate()


def mark_spectral_norms_stale(module: nn.Module) -> None:
    """After changing weights other than by an optimizer step or ``load_state_dict``: refresh at the next forward."""
    for layer in module.modules():
        if isinstance(layer, SpectralNormMixin):
            layer.sn_fresh.fill_(False)


@torch.compiler.disable
def refresh_spectral_norms(module: nn.Module, args: Any = None) -> None:
    """Forward-pre-hook: in training mode, one power iteration for each layer whose weight was updated."""
    if module.training:
        for layer in module.modules():
            if isinstance(layer, SpectralNormMixin):
                layer.refresh()


def install_spectral_refresh(module: nn.Module) -> None:
    """Refresh the spectral norms of ``module``'s layers at the start of each of its forwards."""
    module.register_forward_pre_hook(refresh_spectral_norms)
