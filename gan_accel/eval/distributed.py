"""Sample metrics over several processes: each process generates and featurises its share of N samples (a contiguous
range, ``Accelerator.split_between_processes``), then exactly N rows are gathered, in one process's order: no sample
is repeated to fill the last batch (``gather_for_metrics`` drops repeats only for a prepared DataLoader)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..processes import raise_together
from .features import FeatureExtractor, compute_features


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def share_of(total: int, num_processes: int, rank: int) -> range:
    """The contiguous sample indices that process ``rank`` of ``num_processes`` handles out of ``total``: the
    shares cover ``range(total)`` once, in rank order; the first ``total % num_processes`` get one more sample
    (``Accelerator.split_between_processes``'s split, which :func:`gather_exact` checks every share against).

    Raises TypeError for an argument that is not an int, ValueError for one out of range."""
    _check_int("total", total, 0)
    _check_int("num_processes", num_processes, 1)
    _check_int("rank", rank, 0)
    if rank >= num_processes:
        raise ValueError(f"rank must be < num_processes ({num_processes}), got {rank}")
    base, extra = divmod(total, num_processes)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def gather_exact(accelerator: Any, local: Tensor, total: int) -> Tensor:
    """Collective (call on every process): all ``total`` rows, in index order, on CPU on every process.

    Each process passes the rows of its :func:`share_of` (an empty share: any tensor with 0 rows). Shares are
    padded to the largest one (``pad_across_processes``) for ``accelerator.gather`` and the padding dropped again,
    so row ``i`` is sample ``i``, with no duplicates. Raises ValueError on every process alike (none is left
    waiting) when a row count is not its share's size or the trailing shapes or dtypes differ.
    """
    from accelerate.utils import gather_object

    _check_int("total", total, 0)
    world, rank = accelerator.num_processes, accelerator.process_index
    if local.ndim == 0:
        raise ValueError("local must have a leading row dimension, got a 0-dim tensor")
    # One small exchange of (rows, trailing shape, dtype) lets every process check every share, and
    # tells a process with an empty share what shape and dtype its padding must have.
    reports = gather_object([(int(local.shape[0]), tuple(local.shape[1:]), str(local.dtype))])
    sizes = [len(share_of(total, world, r)) for r in range(world)]
    for r, (rows, _, _) in enumerate(reports):
        if rows != sizes[r]:
            raise ValueError(
                f"process {r} passed {rows} rows to gather_exact, but its share of {total} samples over "
                f"{world} processes has {sizes[r]} rows"
            )
    layouts = {(shape, dtype) for rows, shape, dtype in reports if rows > 0}
    if len(layouts) > 1:
        raise ValueError(f"processes passed rows of different trailing shapes/dtypes: {sorted(layouts)}")
    if not layouts:  # total == 0: nothing to gather
        return local.detach().cpu()
    tail, dtype_name = layouts.pop()
    if not sizes[rank]:  # an empty share pads to the others' trailing shape and dtype, not to its own
        local = torch.zeros((0, *tail), dtype=getattr(torch, dtype_name.removeprefix("torch.")))
    padded = accelerator.pad_across_processes(local.detach().to(accelerator.device))  # to the largest share
    blocks = accelerator.gather(padded).cpu().split(len(padded))  # rank r's padded share is block r
    return torch.cat([block[: sizes[r]] for r, block in enumerate(blocks)])


def generated_features(accelerator: Any, G: nn.Module, extractor: FeatureExtractor, num_samples: int, *,
                       latents: Callable[[torch.Generator, int], Tensor] | None = None, z_dim: int | None = None,
                       labels: Tensor | None = None, seed: int = 1234, batch_size: int = 250) -> Tensor:
    """Collective (call on every process): features (num_samples, F) of ``num_samples`` samples of ``G``
    (bare or prepared, run in eval mode without gradients), each process featurising only its share.

    All latents are drawn on CPU from one generator seeded with ``seed`` (``torch.randn(num_samples, z_dim)`` or
    ``latents(generator, num_samples)``), so the result equals a one-process evaluation row for row. The global
    RNG is never used, G's modes are restored, and an error on one process is raised on every process."""
    _check_int("num_samples", num_samples, 1)
    _check_int("batch_size", batch_size, 1)
    if latents is None and z_dim is None:
        raise ValueError("give z_dim (for torch.randn latents) or a latents(generator, n) callable")
    if labels is not None and (labels.ndim < 1 or labels.shape[0] != num_samples):
        raise ValueError(f"labels must have {num_samples} rows (one per sample), got shape {tuple(labels.shape)}")

    device = accelerator.device
    # Generate with the bare module. Calling a DDP wrapper runs DDP's forward hooks, which may issue
    # collectives (buffer broadcast, reducer bookkeeping); with uneven shares the processes make
    # different numbers of forward calls (or none), so such a collective would wait forever.
    net = accelerator.unwrap_model(G)
    modes = [(module, module.training) for module in G.modules()]
    local, error = torch.empty(0), None
    try:
        generator = torch.Generator().manual_seed(seed)  # every sample's latent, whatever the process count
        if latents is None:
            z_all = torch.randn(num_samples, _check_int("z_dim", z_dim, 1), generator=generator)
        else:
            z_all = latents(generator, num_samples)
            if not isinstance(z_all, Tensor) or z_all.ndim < 1 or z_all.shape[0] != num_samples:
                shape = tuple(z_all.shape) if isinstance(z_all, Tensor) else type(z_all).__name__
                raise ValueError(f"latents(generator, {num_samples}) must return {num_samples} rows (one tensor), "
                                 f"got {shape}")
        # this process's rows of the latents (and labels, kept with their latents): G(z) or G(z, y)
        with accelerator.split_between_processes({"z": z_all} | ({} if labels is None else {"y": labels})) as mine:
            mine = list(mine.values())

        def images() -> Iterator[Tensor]:
            for start in range(0, len(mine[0]), batch_size):
                yield net(*(part[start : start + batch_size].to(device) for part in mine))

        if len(mine[0]):  # an empty share (num_samples < processes) has nothing to generate
            G.eval()
            with torch.no_grad():
                local = compute_features(extractor, images(), batch_size)
    except Exception as caught:  # reported to every process below, so none waits in the gather
        error = caught
    finally:
        for module, training in modes:
            module.training = training
    raise_together(accelerator, error)
    return gather_exact(accelerator, local, num_samples)
