"""Scoring digit generators with a compact MNIST classifier (its features for the distances, its predictions
for the class histogram), trained once and cached under :func:`cache_dir` (data folders may be read-only)."""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.loader import uint8_to_float
from ..data.mnist import MNIST_FILES, DatasetUnavailableError, _short_reason, _socket_timeout, load_mnist_uint8
from ..errors import ConfigError, GanAccelError, NonFiniteWeightsError, UnsafeFileError
from ..storage.files import write_bytes_synced
from ..storage.finite import check_finite
from .feature_cache import cache_dir
from .features import compute_features


class ClassifierCacheError(GanAccelError, RuntimeError):
    """Raised when a cached classifier file cannot be read or does not fit :class:`MnistClassifier`."""


class MnistClassifier(nn.Module):
    """A compact CNN for 1x28x28 digits in [-1, 1] (~98.7% test accuracy after two CPU epochs); ``features(x)``
    are its 128-dim penultimate activations. No dropout or batch norm: train and eval modes agree."""

    feature_dim = 128
    num_classes = 10

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 14x14
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # 7x7
        )
        self.fc = nn.Linear(32 * 7 * 7, self.feature_dim)
        self.head = nn.Linear(self.feature_dim, self.num_classes)

    def features(self, x: Tensor) -> Tensor:
        """Penultimate features (N, 128) of images (N, 1, 28, 28) in [-1, 1]."""
        return F.relu(self.fc(self.conv(x).flatten(1)))

    def forward(self, x: Tensor) -> Tensor:
        """Class logits (N, 10)."""
        return self.head(self.features(x))


def train_mnist_classifier(images: Tensor, labels: Tensor, epochs: int = 2, batch_size: int = 128, lr: float = 2e-3,
                           seed: int = 0) -> MnistClassifier:
    """Train a :class:`MnistClassifier` on CPU from uint8 images (N, 1, 28, 28) and labels (N,); returned in eval
    mode. Deterministic for a seed, and the global RNG is untouched (a GAN run's noise stream must not shift)."""
    if images.ndim != 4 or images.shape[1:] != (1, 28, 28):
        raise ValueError(f"images must have shape (N, 1, 28, 28), got {tuple(images.shape)}")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"labels must have shape ({images.shape[0]},), got {tuple(labels.shape)}")
    x_all = uint8_to_float(images) if images.dtype == torch.uint8 else images.float()
    y_all = labels.long()
    steps_per_epoch = math.ceil(len(x_all) / batch_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MnistClassifier()
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * steps_per_epoch,
                                                        pct_start=0.2)
        shuffle = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(epochs):
            for idx in torch.randperm(len(x_all), generator=shuffle).split(batch_size):
                loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
    return model.eval()


def weights_sha256(state: dict[str, Tensor]) -> str:
    """A SHA-256 of a state dict's names, dtypes, shapes and bytes: what a cached classifier records of itself."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous().cpu()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def load_or_train_classifier(cache_path: str | os.PathLike, images: Tensor, labels: Tensor,
                             **train_kwargs: Any) -> MnistClassifier:
    """Load a cached :class:`MnistClassifier` from ``cache_path`` (safetensors), or train (``train_kwargs``) and
    cache one, written atomically with a SHA-256 of its weights. The cache is verified on every use: a file that
    is not regular, cannot be read, does not match its checksum or does not fit raises ClassifierCacheError in
    one line naming it as corrupt and saying to delete it (a file written before the checksum is checked for fit
    and finite weights only)."""
    from safetensors.torch import save

    path = Path(cache_path)
    if os.path.lexists(path):
        return _cached_classifier(path)
    model = train_mnist_classifier(images, labels, **train_kwargs)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    # per-process temporary name (concurrent runs never clash), the umask's mode (safetensors' writer makes 0600)
    write_bytes_synced(path, save(state, metadata={"sha256": weights_sha256(state)}))
    return model


def _cached_classifier(path: Path) -> MnistClassifier:
    """The classifier cached at ``path``, verified (see :func:`load_or_train_classifier`)."""
    from ..storage.pickles import pickled_call
    from ..storage.reading import open_safetensors

    def corrupt(why: str) -> ClassifierCacheError:
        return ClassifierCacheError(f"the cached MNIST classifier {path} is corrupt ({why}); delete the file to "
                                    f"retrain it (rm {'-r ' if path.is_dir() and not path.is_symlink() else ''}"
                                    f"{path}, then run again: about 30 s)")

    try:
        with open_safetensors(path) as handle:  # a regular file of sane size, then safetensors: tensors only
            meta = handle.metadata() or {}
            state = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as exc:  # safetensors raises its own error types for truncated/garbage files
        if isinstance(exc, UnsafeFileError) and "not a regular file (" in str(exc):
            raise corrupt(str(exc).split("not a regular file (", 1)[1].split(")", 1)[0]) from None
        call = pickled_call(path)  # read without running it: a pickle is never loaded here, only named
        raise corrupt(f"it holds pickled code (GLOBAL {call}) that could run if unpickled, not safetensors" if call
                      else f"it cannot be read: {_short_reason(exc)}") from None
    if "sha256" in meta and meta["sha256"] != weights_sha256(state):
        raise corrupt("its weights do not match the checksum recorded when it was written")
    try:  # a judge with NaN weights would score every generator as nonsense, and say nothing
        check_finite(state, path, fix="delete the file to retrain it")
    except NonFiniteWeightsError as error:
        raise ClassifierCacheError(f"cached MNIST classifier {error}") from None
    model = MnistClassifier()
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise corrupt(f"it does not fit MnistClassifier: {_short_reason(exc)}") from None
    return model.eval()


def evaluate_mnist_samples(
    samples: Tensor,
    real_images: Tensor,
    classifier: MnistClassifier,
    batch_size: int = 500,
    reference: str = "mnist",
) -> dict[str, Any]:
    """Judge generated digits (N, 1, 28, 28) in [-1, 1] against real ones (uint8 or [-1, 1]) with a classifier.

    Returns :func:`gan_accel.eval.score_features`'s ``fd``, ``kid``, ``kid_std``, ``precision``, ``recall`` in
    the classifier's features; ``class_share`` (10 floats) with its ``min_class_share``, ``max_class_share`` and
    ``class_entropy`` (nats, log 10 when balanced); ``mean_confidence`` (mean max softmax: noise can score high
    too, read it next to ``fd``); ``num_samples``, ``num_real`` and ``reference`` (what the real images are).
    """
    for name, t in (("samples", samples), ("real_images", real_images)):
        if t.ndim != 4 or t.shape[1:] != (1, 28, 28):
            raise ValueError(f"{name} must have shape (N, 1, 28, 28), got {tuple(t.shape)}")
    return judge_features(compute_features(classifier.features, samples.float(), batch_size), real_images, classifier,
                          batch_size, reference)


def judge_features(sample_feats: Tensor, real_images: Tensor, classifier: MnistClassifier, batch_size: int = 500,
                   reference: str = "mnist") -> dict[str, Any]:
    """:func:`evaluate_mnist_samples` from the samples' classifier features (N, 128), made chunk by chunk."""
    from .scores import score_features

    if real_images.dtype == torch.uint8:
        real_images = uint8_to_float(real_images)
    classifier.eval()
    real_feats = compute_features(classifier.features, real_images, batch_size)
    with torch.no_grad():
        # The head is a tiny linear layer: reuse the features rather than a second forward pass.
        head_device = classifier.head.weight.device
        probs = classifier.head(sample_feats.to(head_device)).float().softmax(dim=1).cpu()
    share = torch.bincount(probs.argmax(dim=1), minlength=MnistClassifier.num_classes).double() / len(probs)
    nonzero = share[share > 0]
    return {
        **score_features(sample_feats, real_feats),  # fd, kid, kid_std, precision, recall
        "class_share": share.tolist(),
        "min_class_share": float(share.min()),
        "max_class_share": float(share.max()),
        "class_entropy": float(-(nonzero * nonzero.log()).sum()),
        "mean_confidence": float(probs.max(dim=1).values.mean()),
        "num_samples": len(sample_feats),
        "num_real": len(real_images),
        "reference": reference,
    }


def reference_title(reference: str) -> str:
    """How a report names what the samples were compared with."""
    if reference == "mnist":
        return "MNIST evaluation"
    what = "the built-in offline digit set" if reference == "offline-digits" else f"the {reference!r} digit set"
    return f"evaluation against {what}, NOT MNIST (the scores are not MNIST scores)"


def format_evaluation(result: dict[str, Any]) -> str:
    """A short multi-line summary of :func:`evaluate_mnist_samples` output."""
    shares = " ".join(f"{d}:{s:.1%}" for d, s in enumerate(result["class_share"]))
    reference = result.get("reference", "mnist")
    return "\n".join([
        f"{reference_title(reference)} ({result['num_samples']} samples vs {result['num_real']} real, "
        f"in the {reference} classifier's features)",
        f"  Frechet distance: {result['fd']:.3f}",
        f"  KID: {result['kid']:.3f} +- {result['kid_std']:.3f}",
        f"  precision {result['precision']:.3f}, recall {result['recall']:.3f} (k-NN manifolds, k = 3)",
        f"  mean confidence: {result['mean_confidence']:.3f}",
        f"  class entropy: {result['class_entropy']:.3f} nats (balanced = {math.log(10):.3f})",
        f"  class share min/max: {result['min_class_share']:.1%} / {result['max_class_share']:.1%}",
        f"  class shares: {shares}",
    ])


MAX_EVAL_SAMPLES = 50_000  # precision and recall compare every pair of samples: time and memory grow with N^2


@torch.no_grad()
def iter_generated(G: nn.Module, num: int, z_dim: int, device: torch.device | str, seed: int = 1234,
                   batch_size: int = 500, labels: Tensor | None = None) -> Iterator[Tensor]:
    """``num`` images of ``G`` in eval mode from seeded noise (the same for every model), chunk by chunk (float32,
    CPU); ``G(z, labels)`` when ``labels`` (``num`` class indices) are given."""
    generator = torch.Generator().manual_seed(seed)
    was_training = G.training
    G.eval()
    try:
        for start in range(0, num, batch_size):
            z = torch.randn(min(batch_size, num - start), z_dim, generator=generator).to(device)
            extra = () if labels is None else (labels[start:start + len(z)].to(device),)  # G(z) or G(z, labels)
            yield G(z, *extra).float().cpu()
    finally:
        G.train(was_training)


def _check_eval_size(num: int) -> None:
    if not isinstance(num, int) or isinstance(num, bool) or not 1 <= num <= MAX_EVAL_SAMPLES:
        raise ConfigError(f"{num!r} samples to score: score 1 to {MAX_EVAL_SAMPLES:,} (precision and recall compare "
                          "every pair of samples, so time and memory grow with the square of the number)")


def reference_digits(data_dir: str | os.PathLike, fallback=None, download: bool = False) -> tuple[str, tuple, tuple]:
    """(name, (train images, labels), (held-out images, labels)): real MNIST, or the ``fallback`` set (a
    ``DatasetInfo``) when MNIST cannot be read or the run trained on that set; without a fallback, MNIST
    missing is a :class:`~gan_accel.data.mnist.DatasetUnavailableError` saying where it looked."""
    if fallback is not None and fallback.name != "mnist":
        return _split(fallback)
    try:
        with _socket_timeout(15.0) if download else contextlib.nullcontext():
            return ("mnist", load_mnist_uint8(data_dir, train=True, download=download),
                    load_mnist_uint8(data_dir, train=False, download=download))
    except (RuntimeError, OSError, EOFError, ValueError) as error:
        if fallback is None:
            raise DatasetUnavailableError(mnist_missing(data_dir, error, download)) from None
    return _split(fallback)


def mnist_missing(data_dir: str | os.PathLike, error: BaseException, download: bool) -> str:
    """Where MNIST was looked for, what was wrong, and how to point at it (for the one-line error)."""
    raw = Path(data_dir) / "MNIST" / "raw"
    missing = [f for f in MNIST_FILES if not (raw / f).exists() and not (raw / f"{f}.gz").exists()]
    if download:
        what = f"MNIST could not be downloaded into {raw} ({_short_reason(error)})"
    elif missing:
        what = f"MNIST is not in {raw} (looked for {', '.join(MNIST_FILES)}; missing: {', '.join(missing)})"
    else:
        what = f"MNIST in {raw} is unreadable ({_short_reason(error)}; truncated files?)"
    return (f"{what}: pass the folder that holds MNIST/raw as the data folder (gan-accel eval --data-dir DIR, or "
            "the environment variable GAN_ACCEL_DATA_DIR), or let it download there on a machine with network "
            "access (gan-accel eval --download)")


def _split(fallback) -> tuple[str, tuple, tuple]:
    # Offline digits: train the judge on the first 5/6, compare against the last 1/6.
    cut = len(fallback.images) * 5 // 6
    return (fallback.name, (fallback.images[:cut], fallback.labels[:cut]),
            (fallback.images[cut:], fallback.labels[cut:]))


def _judge(data_dir: str | os.PathLike, fallback, download: bool) -> tuple[str, MnistClassifier, Tensor]:
    """(the reference's name, its cached classifier, its held-out images)."""
    name, (train_x, train_y), (held_x, _) = reference_digits(data_dir, fallback, download)
    return name, load_or_train_classifier(cache_dir() / f"{name}_classifier.safetensors", train_x, train_y), held_x


def evaluate_generator(G: nn.Module, data_dir: str | os.PathLike, z_dim: int, device: torch.device | str = "cpu",
                       fallback=None, num_samples: int = 10_000, download: bool = False) -> dict[str, Any]:
    """Generate ``num_samples`` digits and score them against held-out real digits: :func:`evaluate_mnist_samples`'s
    dict plus a printable ``summary``."""
    _check_eval_size(num_samples)
    name, classifier, held_x = _judge(data_dir, fallback, download)
    features = compute_features(classifier.features, iter_generated(G, num_samples, z_dim, device), 500)
    result = judge_features(features, held_x[:num_samples], classifier, reference=name)
    result["summary"] = format_evaluation(result)
    return result


def evaluate_conditional_generator(G: nn.Module, data_dir: str | os.PathLike, z_dim: int,
                                   device: torch.device | str = "cpu", fallback=None,
                                   per_class: int = 1000, download: bool = False) -> dict[str, Any]:
    """Ask a conditional ``G(z, y)`` for ``per_class`` samples of each digit and judge them: the scores of
    :func:`evaluate_generator` plus ``agreement`` (per digit, the share the classifier assigns to it),
    ``mean_agreement`` and ``min_agreement``."""
    _check_eval_size(per_class * MnistClassifier.num_classes)
    name, classifier, held_x = _judge(data_dir, fallback, download)
    labels = torch.arange(MnistClassifier.num_classes).repeat_interleave(per_class)
    features = compute_features(classifier.features, iter_generated(G, len(labels), z_dim, device, labels=labels), 500)
    result = judge_features(features, held_x[:len(labels)], classifier, reference=name)
    with torch.no_grad():  # the head on the features: the classifier's prediction, without a second forward
        predicted = classifier.head(features.to(classifier.head.weight.device)).argmax(dim=1).cpu()
    agreement = [float((predicted[labels == d] == d).float().mean()) for d in range(MnistClassifier.num_classes)]
    result.update(agreement=agreement, mean_agreement=sum(agreement) / len(agreement), min_agreement=min(agreement))
    result["summary"] = "\n".join([
        f"conditional {reference_title(name)} ({per_class} samples per digit, judged by a classifier trained on "
        f"{name})",
        "  agreement per digit: " + " ".join(f"{d}:{a:.1%}" for d, a in enumerate(agreement)),
        f"  mean agreement {result['mean_agreement']:.1%}, lowest {result['min_agreement']:.1%}",
        f"  Frechet distance (classifier features, all {len(labels)} samples): {result['fd']:.3f}, "
        f"KID {result['kid']:.3f}, precision {result['precision']:.3f}, recall {result['recall']:.3f}",
    ])
    return result
