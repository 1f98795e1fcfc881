"""D's probe: the discriminator's logits on fixed images, and what they say about its health.

Measured by :class:`~gan_accel.callbacks.HealthMonitor` at every sample interval, on every process alike: D on
a fixed batch of training reals (the first batch, ``trainer.reference_samples``), on G's samples of the fixed
latents, and on held-out reals when the monitor has them. The probe changes nothing of the run: no gradient,
no augmentation (D's verdict on the images themselves), the global RNG untouched, and the networks' buffers
(BatchNorm statistics, spectral-norm vectors) put back as they were, so a resumed run is still bitwise the
uninterrupted one.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

# Below this gap between D's mean logits on training reals and on fakes, D barely tells them apart and the
# overfit ratio would be noise divided by noise: it is not computed.
OVERFIT_MIN_GAP = 0.1


@contextlib.contextmanager
def untouched(*nets: nn.Module) -> Iterator[None]:
    """No gradient, the global RNG forked (a dropout layer draws from a copy), and every buffer of ``nets``
    put back afterwards: forwards in train mode leave the run exactly as they found it."""
    saved = [(b, b.detach().clone()) for net in nets for b in net.buffers()]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _to(x: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """A tensor (or a tuple/list/dict of them, as latents may be) on ``device``; floats in ``dtype``."""
    if isinstance(x, Tensor):
        return x.to(device, dtype if dtype is not None and x.is_floating_point() else x.dtype)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(item, device, dtype) for item in x)
    if isinstance(x, dict):
        return {key: _to(value, device, dtype) for key, value in x.items()}
    return x


def _placement(net: nn.Module, fallback: torch.device) -> tuple[torch.device, torch.dtype | None]:
    param = next(net.parameters(), None)
    if param is None:
        return fallback, None
    return param.device, param.dtype if param.is_floating_point() else None


def probe_logits(trainer: "GANTrainer", reals: Tensor, real_labels: Tensor | None,
                 held_out: Tensor | None = None, held_labels: Tensor | None = None) -> dict[str, Tensor]:
    """D's logits (float32, CPU) on ``reals``, on G's samples of the fixed latents and on ``held_out``.

    The raw G, not its EMA: D is trained against the raw G. Both networks run unwrapped (a DDP wrapper would
    start collectives), in the mode they are in (train mode during training: the BatchNorm statistics D and G
    train with), under the run's autocast, without the run's augmentation.
    """
    acc = trainer.accelerator
    G, D = acc.unwrap_model(trainer.G), acc.unwrap_model(trainer.D)
    conditional = trainer.conditioning.conditional
    g_device, g_dtype = _placement(G, acc.device)
    d_device, d_dtype = _placement(D, acc.device)
    latents, fake_labels = trainer.fixed_latents, trainer.fixed_labels

    def judge(x: Tensor, labels: Tensor | None) -> Tensor:
        x = _to(x, d_device, d_dtype)
        out = D(x, labels.to(d_device)) if conditional else D(x)
        return out.float().reshape(x.shape[0], -1)[:, 0].cpu()

    with untouched(G, D), acc.autocast():
        z = _to(latents, g_device, g_dtype)
        fake = G(z, fake_labels.to(g_device)) if conditional else G(z)
        logits = {"real": judge(reals, real_labels), "fake": judge(fake, fake_labels)}
        if held_out is not None:
            logits["held_out"] = judge(held_out, held_labels)
    return logits


def probe_statistics(real: Tensor, fake: Tensor, held_out: Tensor | None = None) -> dict[str, float]:
    """The ``health/*`` values of D's logits on training reals, fakes and (optionally) held-out reals.

    ``d_spread``: the standard deviation of D's logits over reals and fakes together (a dead D: about 0);
    ``d_real``, ``d_fake``, ``d_heldout``: the mean logits; ``rt``: the fraction of (real, fake) pairs that D
    orders correctly, ties counting half (0.5: D cannot tell them apart, 1: it always can); ``overfit``:
    (D(train) - D(held-out)) / (D(train) - D(fake)), about 0 when D judges unseen reals like the training
    ones, 1 when like fakes; left out when D(train) - D(fake) < :data:`OVERFIT_MIN_GAP`.
    """
    real, fake = real.double(), fake.double()
    both = torch.cat([real, fake])
    pairs = real[:, None] - fake[None, :]
    values = {"health/d_spread": float(both.std()) if len(both) > 1 else 0.0,
              "health/d_real": float(real.mean()), "health/d_fake": float(fake.mean()),
              "health/rt": float((pairs > 0).double().mean() + 0.5 * (pairs == 0).double().mean())}
    if held_out is not None and len(held_out):
        d_real, d_fake, d_held = float(real.mean()), float(fake.mean()), float(held_out.double().mean())
        values["health/d_heldout"] = d_held
        if d_real - d_fake >= OVERFIT_MIN_GAP:
            values["health/overfit"] = (d_real - d_held) / (d_real - d_fake)
    return values
