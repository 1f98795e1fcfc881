"""What a phase's loss sees: the current micro-batch, the networks, and a few helpers.

A phase loss is ``loss(ctx) -> scalar``. Through ``ctx`` it reads the real samples and labels,
the latents, G's samples (``ctx.fake``), and calls the networks (``ctx.generate``,
``ctx.discriminate``), which pass labels along in a conditional run. The engine decides the
rest: which network is frozen, autocast, accumulation, DDP synchronisation.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import Tensor, nn

from ..errors import PhaseError
from ..objectives.regularizers import scaled_input_gradients
from ..augment import Augment
from .augmentation import augmented
from .phases import DISCRIMINATOR, GENERATOR
from .speed import eager_module

if TYPE_CHECKING:
    from .phases import Phase


@contextlib.contextmanager
def frozen(params: Iterable[Tensor]) -> Iterator[None]:
    """``params`` (those of the networks a phase does not train) take no gradient while the block runs."""
    params = list(params)
    for param in params:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param in params:
            param.requires_grad_(True)


class MicroBatch:
    """One micro-batch of a window: real samples, labels, latents and (cached) G samples."""

    __slots__ = ("real", "real_labels", "latents", "fake_labels", "fake", "fake_version", "fake_has_graph")

    def __init__(self, real: Tensor, real_labels: Tensor | None, latents: Any, fake_labels: Tensor | None) -> None:
        self.real, self.real_labels, self.latents, self.fake_labels = real, real_labels, latents, fake_labels
        self.fake: Tensor | None = None
        self.fake_version = -1
        self.fake_has_graph = False


class StepContext:
    """The step as a phase loss sees it (one object per trainer, pointed at the current micro-batch).

    Attributes:
        nets: the prepared networks by name (``ctx.nets["G"]``, ``ctx.nets["D"]``, extras). With
            ``compile=True`` these are the compiled G and D, except in a phase marked
            ``double_backward=True``, which sees the eager modules (same parameters): torch.compile
            does not support a double backward.
        phase: the phase being run.
        step: steps completed before this one.
        images: training images seen before this step, over all processes (what a Ramp's value is read at).
        augment: the run's augmentation of every image D sees (None: none; see engine/augmentation.py).
    """

    def __init__(self, nets: Mapping[str, nn.Module], *, conditional: bool = False,
                 log: Callable[[str, Tensor], None] | None = None, scaler: Any | None = None,
                 updates: Mapping[str, int] | None = None, augment: Augment | None = None,
                 observe_real: Callable[[Tensor], None] | None = None) -> None:
        self._nets = nets
        self._eager = {name: eager_module(net) for name, net in nets.items()}
        self.compiled = any(self._eager[name] is not net for name, net in nets.items())
        self.conditional = conditional
        self.scaler = scaler
        self._log = log
        self.augment = augment
        self._observe_real = observe_real
        self._updates = updates if updates is not None else {name: 0 for name in nets}  # versions of the networks
        self.phase: Phase | None = None
        self.micro: MicroBatch | None = None
        self.step = 0
        self.images = 0

    # -- the micro-batch ------------------------------------------------------------------------
    @property
    def real(self) -> Tensor:
        """Real samples of this micro-batch."""
        return self.micro.real

    @property
    def real_labels(self) -> Tensor | None:
        """Labels of the real samples (None in an unconditional run)."""
        return self.micro.real_labels

    @property
    def latents(self) -> Any:
        """The latents drawn for this micro-batch (what the latent sampler returned)."""
        return self.micro.latents

    @property
    def fake_labels(self) -> Tensor | None:
        """The labels G is asked for (None in an unconditional run)."""
        return self.micro.fake_labels

    @property
    def fake(self) -> Tensor:
        """G's samples for this micro-batch's latents, once per version of G; detached unless the phase trains
        G, so a loss of another network can never push gradients into G."""
        micro = self.micro
        trains_G = self.phase is not None and self.phase.net == GENERATOR
        version = self._updates[GENERATOR]
        if micro.fake is not None and micro.fake_version == version and (micro.fake_has_graph or not trains_G):
            return micro.fake if trains_G else micro.fake.detach()
        if trains_G:
            fake = self.generate(micro.latents, micro.fake_labels)
        else:
            with torch.no_grad():
                fake = self.generate(micro.latents, micro.fake_labels)
        micro.fake, micro.fake_version, micro.fake_has_graph = fake, version, trains_G
        return fake

    # -- the networks ---------------------------------------------------------------------------
    @property
    def nets(self) -> Mapping[str, nn.Module]:
        """The networks by name: compiled views if compiled, the eager modules in a double-backward phase."""
        if self.compiled and self.phase is not None and self.phase.double_backward:
            return self._eager
        return self._nets

    @property
    def G(self) -> nn.Module:
        return self.nets[GENERATOR]

    @property
    def D(self) -> nn.Module:
        return self.nets[DISCRIMINATOR]

    def generate(self, latents: Any, labels: Tensor | None = None) -> Tensor:
        """``G(latents)``, or ``G(latents, labels)`` in a conditional run."""
        G = self.nets[GENERATOR]
        return G(latents, labels) if self.conditional else G(latents)

    def discriminate(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """``D(x)``, or ``D(x, labels)`` in a conditional run: one logit per sample. With an augmentation,
        D sees ``augment(x)`` (differentiable: gradients reach ``x`` through it)."""
        x = augmented(self.augment, x)
        return self.nets[DISCRIMINATOR](x, labels) if self.conditional else self.nets[DISCRIMINATOR](x)

    def class_logits(self, x: Tensor, labels: Tensor) -> Tensor:
        """``D(x, labels, all_classes=True)``: D's logit for every class, shape (N, num_classes); column
        ``labels[i]`` is the plain logit, so one forward serves the adversarial and the class loss."""
        try:
            logits = self.nets[DISCRIMINATOR](augmented(self.augment, x), labels, all_classes=True)
        except TypeError as error:
            if "all_classes" not in str(error):
                raise
            raise TypeError("class_loss_weight > 0 calls D(x, labels, all_classes=True) for one logit per class, "
                            "shape (N, num_classes), and this D does not take all_classes: add it (see "
                            "gan_accel.models.ProjectionDiscriminator) or set class_loss_weight=0") from error
        if logits.dim() != 2 or logits.shape[0] != x.shape[0]:
            raise ValueError(f"D(x, labels, all_classes=True) returned shape {tuple(logits.shape)}: a class loss "
                             "needs one logit per class, shape (N, num_classes)")
        return logits

    # -- helpers --------------------------------------------------------------------------------
    def observe_real(self, logits: Tensor) -> None:
        """D's logits on this micro-batch's real images, from D's adversarial loss: what an adaptive
        augmentation (ADA) steers by. Phase losses of your own that replace D's loss should call it too."""
        if self._observe_real is not None:
            self._observe_real(logits)

    def log(self, key: str, value: Tensor) -> None:
        """Add a scalar to the running means logged as ``key`` (stays on the device: no sync)."""
        if self._log is not None:
            self._log(key, value)

    def input_gradients(self, output: Tensor, inputs: Tensor) -> Tensor:
        """``d output / d inputs`` with a graph, correct under fp16 loss scaling (for gradient penalties)."""
        if self.compiled and not (self.phase is not None and self.phase.double_backward):
            name = self.phase.name if self.phase is not None else "?"
            raise PhaseError(f"phase {name!r} takes input gradients (a double backward) through the compiled networks, "
                             "which torch.compile does not support: create it with Phase(..., double_backward=True) "
                             "so it runs on the eager modules, or set compile=False")
        return scaled_input_gradients(output, inputs, self.scaler)
