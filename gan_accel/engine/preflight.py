"""Checks that run before training, so a mistake costs seconds, not a failed run.

Each raises :class:`~gan_accel.errors.PreflightError` naming the problem and the fix, or warns
(:class:`~gan_accel.errors.PreflightWarning`). The dry run leaves the global RNG and the buffers as they were.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from ..errors import PreflightError, PreflightWarning
from ..batch import LABEL_KEYS, split_batch
from .conditioning import Conditioning
from .context import MicroBatch, StepContext, frozen
from .latents import LatentSampler, leading_size, map_tensors
from .phases import PhasePlan

# Autograd nodes that only reshape or copy: looking through them finds a network's last real operation.
_PASS_THROUGH = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Clone", "ToCopy", "Expand", "Permute",
                 "Transpose", "Select", "Slice", "AsStrided", "Flatten", "Contiguous", "Alias")


def check_dataloader(dataloader: DataLoader, batch_size: int) -> None:
    """Empty datasets and a batch size larger than the dataset (with drop_last) are refused."""
    n_items = _length(getattr(dataloader, "dataset", None))
    if n_items == 0:
        raise PreflightError("the training dataset is empty: check the data path and any filtering")
    loader_batch = getattr(dataloader, "batch_size", None)
    if _length(dataloader) == 0:
        raise PreflightError(f"the dataloader yields no batches: batch size {loader_batch or batch_size} is larger "
                             f"than the dataset ({n_items} items) and drop_last=True; use a smaller batch size or "
                             "more data")
    if loader_batch is not None and loader_batch != batch_size:
        raise PreflightError(f"the dataloader's batch_size={loader_batch} differs from config.batch_size={batch_size}: "
                             "build the DataLoader with the config's batch size (it is the per-process batch)")


def _length(sized: Any) -> int | None:
    """``len(sized)``, or None for what has no length (an iterable dataset, None)."""
    try:
        return len(sized) if sized is not None else None
    except TypeError:
        return None


def dry_run(nets: Mapping[str, nn.Module], plan: PhasePlan, dataloader: DataLoader, sample_latents: LatentSampler,
            *, conditioning: Conditioning = Conditioning(), num_reference: int = 64,
            warn: bool = True) -> tuple[Tensor, Tensor | None]:
    """Run G, D and every phase once on two real samples; return up to ``num_reference`` real samples of the
    first batch (CPU) and their labels (None without labels)."""
    buffers = {id(b): b.detach().clone() for net in nets.values() for b in net.buffers()}
    try:
        with torch.random.fork_rng(devices=[]):
            conditional = conditioning.conditional
            reference, reference_labels, micro = _first_micro_batch(nets, dataloader, sample_latents, conditioning)
            fake = _check_networks(nets, micro, conditional, warn)
            if warn:
                _warn_about_ranges(fake, reference)
            _check_phases(nets, plan, micro, conditional)
    finally:
        for net in nets.values():
            for b in net.buffers():
                b.copy_(buffers[id(b)])
    return reference[:num_reference], None if reference_labels is None else reference_labels[:num_reference]


def _first_micro_batch(nets, dataloader, sample_latents,
                       conditioning: Conditioning) -> tuple[Tensor, Tensor | None, MicroBatch]:
    try:
        batch = next(iter(dataloader))
    except StopIteration:
        raise PreflightError("the dataloader yields no batches") from None
    try:
        real, labels = split_batch(batch)
    except TypeError as error:
        raise PreflightError(str(error)) from None
    if not real.is_floating_point():
        raise PreflightError(
            f"the real samples are {real.dtype}: convert them to floating point in the range G produces "
            "(e.g. uint8 images x / 127.5 - 1 for a tanh generator)"
        )
    reference = real.detach().cpu()
    reference_labels = labels.detach().cpu() if isinstance(labels, Tensor) else None
    device = _device_of(nets["D"]) or real.device
    real = real[:2].to(device)
    labels = labels[:2].to(device) if labels is not None else None
    latents = sample_latents(real.shape[0], _device_of(nets["G"]) or device)
    size = leading_size(latents)
    if size != real.shape[0]:
        raise PreflightError(
            f"the latent sampler returned a batch of {size} when asked for {real.shape[0]}: it must return "
            "latents whose first dimension is the batch_size argument (sampler(batch_size, device))"
        )
    if conditioning.conditional:
        _check_labels(labels, conditioning.num_classes, "the real batches' labels")
    fake_labels = conditioning.fake_labels(real.shape[0], device, labels)
    if conditioning.conditional:
        _check_labels(fake_labels, conditioning.num_classes, "the label sampler's labels", real.shape[0])
    return reference, reference_labels, MicroBatch(real, labels, latents, fake_labels)


def _check_labels(labels: Tensor | None, num_classes: int, what: str, batch_size: int | None = None) -> None:
    """Class indices: an integer tensor of shape (N,) with values in [0, num_classes)."""
    if labels is None:
        raise PreflightError(
            f"the run is conditional (num_classes={num_classes}) but the batches carry no labels: yield (images, "
            f"labels) pairs or dicts with one of the keys {list(LABEL_KEYS)}, or set num_classes=None")
    if not isinstance(labels, Tensor) or labels.dtype.is_floating_point or labels.dtype == torch.bool \
            or labels.dim() != 1:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise PreflightError(
            f"{what} must be integer class indices of shape (N,), got {getattr(labels, 'dtype', '')} {shape}: "
            "pass class numbers (e.g. labels.argmax(1) for one-hot labels), as a long tensor")
    if batch_size is not None and labels.shape[0] != batch_size:
        raise PreflightError(f"{what}: {labels.shape[0]} labels for a batch of {batch_size}: the label sampler "
                             "must return batch_size labels")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise PreflightError(
            f"{what} hold class {low if low < 0 else high}, outside [0, {num_classes}) for num_classes={num_classes}: "
            "set num_classes to the number of classes in the data (labels 0 .. num_classes - 1)")


def _check_networks(nets, micro: MicroBatch, conditional: bool, warn: bool) -> Tensor:
    """G and D accept what they will be given and return what the engine needs; returns G's samples."""
    G, D = nets["G"], nets["D"]
    real = micro.real
    try:
        fake = G(micro.latents, micro.fake_labels) if conditional else G(micro.latents)
    except Exception as error:
        call = "G(latents, labels) (a conditional run: G must take the labels as its second argument)" \
            if conditional else "G(latents)"
        shapes = map_tensors(micro.latents, lambda t: f"Tensor{tuple(t.shape)}")
        raise PreflightError(f"{call} failed on latents {shapes}: {type(error).__name__}: {error}") from error
    if not isinstance(fake, Tensor):
        raise PreflightError(f"G must return a tensor of samples, got {type(fake).__name__}")
    if tuple(fake.shape[1:]) != tuple(real.shape[1:]):
        raise PreflightError(
            f"G produces samples of shape {tuple(fake.shape[1:])} but the data has {tuple(real.shape[1:])}: "
            "make G's output size and channels match the dataset (or resize the data)"
        )
    if fake.dtype != real.dtype:
        raise PreflightError(
            f"G produces {fake.dtype} samples but the real data is {real.dtype}: convert the data or the models "
            "so they agree (mixed precision is applied by the engine, not by the data)"
        )
    for name, samples, labels in (("real samples", real, micro.real_labels), ("G's samples", fake, micro.fake_labels)):
        try:
            logits = D(samples, labels) if conditional else D(samples)
        except Exception as error:
            call = "D(x, labels) (a conditional run: D must take the labels as its second argument)" \
                if conditional else "D"
            raise PreflightError(
                f"{call} failed on {name} of shape {tuple(samples.shape)}: {type(error).__name__}: {error}") from error
        n = samples.shape[0]
        if not isinstance(logits, Tensor) or logits.numel() != n or logits.shape[0] != n:
            shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise PreflightError(
                f"D must return one logit per sample, shape ({n},) or ({n}, 1), but returned {shape} for {n} "
                f"{name}: end D with a single-output layer and no pooling over the batch"
            )
        if warn and name == "real samples" and _last_operation(logits) == "Sigmoid":
            warnings.warn(
                "D ends in a sigmoid, but gan_accel's losses take logits (they apply the sigmoid themselves, "
                "stably): remove D's final sigmoid", PreflightWarning, stacklevel=4)
    return fake


def _warn_about_ranges(fake: Tensor, reference: Tensor) -> None:
    """G ending in tanh can only produce [-1, 1]: real data outside that range is a scaling mistake."""
    if _last_operation(fake) != "Tanh":
        return
    low, high = float(reference.min()), float(reference.max())
    if low < -1.001 or high > 1.001:
        warnings.warn(
            f"G ends in tanh (outputs in [-1, 1]) but the real data lies in [{low:.3g}, {high:.3g}]: scale the "
            "data to [-1, 1] (uint8 images: x / 127.5 - 1)", PreflightWarning, stacklevel=3)


def _check_phases(nets, plan: PhasePlan, micro: MicroBatch, conditional: bool) -> None:
    """Each phase's loss once: it must run, return a scalar and depend on the network it trains."""
    trainable = {name: [p for p in net.parameters() if p.requires_grad] for name, net in nets.items()}
    ctx = StepContext(nets, conditional=conditional)
    for phase in {p.name: p for p in plan.phases}.values():
        ctx.phase, ctx.micro = phase, MicroBatch(micro.real, micro.real_labels, micro.latents, micro.fake_labels)
        try:
            with frozen(p for name, params in trainable.items() if name != phase.net for p in params):
                loss = phase.loss(ctx)
        except Exception as error:
            raise PreflightError(
                f"phase {phase.name!r} failed on a 2-sample batch: {type(error).__name__}: {error}") from error
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise PreflightError(f"phase {phase.name!r}: its loss must return a scalar tensor (the mean over the "
                                 f"micro-batch), got {shape}")
        if not loss.requires_grad:
            raise PreflightError(f"phase {phase.name!r}: its loss does not depend on network {phase.net!r}'s "
                                 "parameters, so the update would do nothing: check which network it calls")


def _last_operation(output: Tensor) -> str | None:
    """The name of the last non-reshaping autograd operation that produced ``output`` (e.g. 'Tanh')."""
    node = output.grad_fn
    while node is not None:
        name = type(node).__name__.removesuffix("Backward0").removesuffix("Backward1")
        if name not in _PASS_THROUGH:
            return name
        parents = [next_node for next_node, _ in node.next_functions if next_node is not None]
        node = parents[0] if len(parents) == 1 else None
    return None


def _device_of(module: nn.Module) -> torch.device | None:
    param = next(module.parameters(), None)
    return param.device if param is not None else None
