"""Sample-quality metrics: Fréchet distance on pluggable features, and an MNIST classifier evaluation.

The Fréchet distance between two Gaussians fitted to feature sets is

    |mu1 - mu2|^2 + tr(sigma1) + tr(sigma2) - 2 tr((sigma1 sigma2)^(1/2)).

It is computed here in float64 with torch alone (no scipy): ``sigma1 sigma2`` is similar to the
symmetric PSD matrix ``s sigma2 s`` with ``s = sigma1^(1/2)``, so the trace of its square root is the
sum of the square roots of that matrix's eigenvalues, which a symmetric eigensolver gives stably.

For MNIST, features come from a small CNN classifier trained on real MNIST (:class:`MnistClassifier`),
cached as safetensors so it is trained once per data directory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Protocol, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data import uint8_to_float
from .files import atomic_path
from .engine import extract_images


class ClassifierCacheError(RuntimeError):
    """Raised when a cached classifier file cannot be read or does not fit :class:`MnistClassifier`."""


# ----------------------------------------------------------------------------- Fréchet distance


def _sym_sqrt(matrix: Tensor) -> Tensor:
    """Square root of a symmetric PSD matrix via eigendecomposition (tiny negative eigenvalues -> 0)."""
    eigvals, eigvecs = torch.linalg.eigh(matrix)
    # Round-off makes near-zero eigenvalues of a PSD matrix slightly negative; sqrt would give NaN.
    return (eigvecs * eigvals.clamp_min(0).sqrt()) @ eigvecs.T


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2), computed in float64.

    Args:
        mu1, mu2: means, shape (F,).
        sigma1, sigma2: symmetric PSD covariances, shape (F, F).
    """
    mu1, mu2, sigma1, sigma2 = (t.detach().to(torch.float64).cpu() for t in (mu1, mu2, sigma1, sigma2))
    if mu1.shape != mu2.shape or mu1.ndim != 1:
        raise ValueError(f"means must be 1-D with equal shapes, got {tuple(mu1.shape)} and {tuple(mu2.shape)}")
    dim = mu1.shape[0]
    if sigma1.shape != (dim, dim) or sigma2.shape != (dim, dim):
        raise ValueError(
            f"covariances must have shape ({dim}, {dim}), got {tuple(sigma1.shape)} and {tuple(sigma2.shape)}"
        )
    # Symmetrize first: eigh reads only one triangle, so an asymmetric input would be silently misread.
    sigma1 = (sigma1 + sigma1.T) / 2
    sigma2 = (sigma2 + sigma2.T) / 2
    root1 = _sym_sqrt(sigma1)
    middle = root1 @ sigma2 @ root1
    trace_sqrt = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp_min(0).sqrt().sum()
    diff = mu1 - mu2
    value = diff @ diff + torch.trace(sigma1) + torch.trace(sigma2) - 2 * trace_sqrt
    # Mathematically >= 0; clamp the round-off of (near-)identical distributions.
    return max(float(value), 0.0)


def feature_statistics(features: Tensor) -> tuple[Tensor, Tensor]:
    """Mean (F,) and unbiased covariance (F, F) of features (N, F), both float64 on CPU."""
    if features.ndim != 2:
        raise ValueError(f"features must have shape (N, F), got {tuple(features.shape)}")
    if features.shape[0] < 2:
        raise ValueError(f"need at least 2 feature vectors for a covariance, got {features.shape[0]}")
    features = features.detach().to(torch.float64).cpu()
    mu = features.mean(dim=0)
    centered = features - mu
    sigma = centered.T @ centered / (features.shape[0] - 1)
    return mu, sigma


def frechet_distance_from_features(feats_a: Tensor, feats_b: Tensor) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets (N_a, F) and (N_b, F)."""
    return frechet_distance(*feature_statistics(feats_a), *feature_statistics(feats_b))


# ----------------------------------------------------------------------------- feature extraction


class FeatureExtractor(Protocol):
    """Any callable mapping an image batch (N, C, H, W) in [-1, 1] to features (N, F)."""

    def __call__(self, images: Tensor) -> Tensor: ...


def _extractor_device(extractor: FeatureExtractor) -> torch.device | None:
    """The device of a module (or a bound method of one) extractor; None if it cannot be told."""
    module = extractor if isinstance(extractor, nn.Module) else getattr(extractor, "__self__", None)
    if isinstance(module, nn.Module):
        param = next(module.parameters(), None)
        if param is not None:
            return param.device
    return None


def compute_features(
    extractor: FeatureExtractor,
    images: Union[Tensor, Iterable[Any]],
    batch_size: int = 256,
) -> Tensor:
    """Features (N, F) of images, computed under ``torch.no_grad`` in batches, returned float32 on CPU.

    ``images`` is either one tensor (N, C, H, W), split into batches of ``batch_size``, or an iterable
    of batches (tensors, ``(images, labels)`` pairs or dicts, e.g. a DataLoader), used as given.
    Batches are moved to the extractor's device when it is a module or a bound method of one.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = images.split(batch_size) if isinstance(images, Tensor) else (extract_images(b) for b in images)
    device = _extractor_device(extractor)
    outputs = []
    with torch.no_grad():
        for batch in batches:
            if device is not None:
                batch = batch.to(device)
            feats = extractor(batch)
            if feats.ndim != 2 or feats.shape[0] != batch.shape[0]:
                raise ValueError(
                    f"feature extractor must return (N, F) for a batch of N={batch.shape[0]}, "
                    f"got {tuple(feats.shape)}"
                )
            outputs.append(feats.float().cpu())
    if not outputs:
        raise ValueError("no images to compute features of")
    return torch.cat(outputs)


# ----------------------------------------------------------------------------- MNIST classifier


class MnistClassifier(nn.Module):
    """A compact CNN for 1x28x28 digits in [-1, 1]: two conv blocks (16, 32 channels), a 128-unit
    layer, 10 logits. Small enough to train to ~98.7% test accuracy in two CPU epochs (~30 s, 2 cores).

    ``features(x)`` returns the 128-dim penultimate activations used for the Fréchet distance.
    No dropout or batch norm, so train and eval modes compute the same function.
    """

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


def train_mnist_classifier(
    images: Tensor,
    labels: Tensor,
    epochs: int = 2,
    batch_size: int = 128,
    lr: float = 2e-3,
    seed: int = 0,
) -> MnistClassifier:
    """Train a :class:`MnistClassifier` on CPU from uint8 images (N, 1, 28, 28) and labels (N,).

    Deterministic for a given seed, and leaves the global RNG state untouched (training inside a
    GAN run must not shift its noise stream). Adam with a one-cycle schedule reaches ~98.7% test
    accuracy on MNIST in the default two epochs. Returns the model in eval mode.
    """
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
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=0.2
        )
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


def classifier_accuracy(classifier: nn.Module, images: Tensor, labels: Tensor, batch_size: int = 1000) -> float:
    """Top-1 accuracy of a classifier on uint8 (or [-1, 1] float) images (N, 1, 28, 28)."""
    x = uint8_to_float(images) if images.dtype == torch.uint8 else images
    logits = compute_features(classifier, x, batch_size=batch_size)
    return float((logits.argmax(1) == labels.cpu()).float().mean())


def load_or_train_classifier(
    cache_path: str | os.PathLike,
    images: Tensor,
    labels: Tensor,
    **train_kwargs: Any,
) -> MnistClassifier:
    """Load a cached :class:`MnistClassifier` from ``cache_path`` (safetensors), or train and cache one.

    A typical cache path is ``<data_dir>/gan_accel_mnist_classifier.safetensors``. The file is written
    atomically (temporary file, then rename), so concurrent runs never read half a file.
    ``train_kwargs`` go to :func:`train_mnist_classifier` and matter only when training.

    Raises:
        ClassifierCacheError: the file exists but is unreadable or its weights do not fit the model.
    """
    from safetensors.torch import load_file, save_file

    path = Path(cache_path)
    if path.exists():
        try:
            state = load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types for truncated/garbage files
            raise ClassifierCacheError(
                f"cannot read cached MNIST classifier {path} ({exc}); delete the file to retrain it"
            ) from exc
        model = MnistClassifier()
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        found = {k: tuple(v.shape) for k, v in state.items()}
        if found != expected:
            diff = sorted(set(expected.items()) ^ set(found.items()))
            raise ClassifierCacheError(
                f"cached MNIST classifier {path} does not fit MnistClassifier (mismatched entries: "
                f"{diff[:6]}); delete the file to retrain it"
            )
        model.load_state_dict(state)
        return model.eval()

    model = train_mnist_classifier(images, labels, **train_kwargs)
    with atomic_path(path) as tmp:  # per-process temporary name: concurrent runs never clash
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    return model


# ----------------------------------------------------------------------------- evaluation


def evaluate_mnist_samples(
    samples: Tensor,
    real_images: Tensor,
    classifier: MnistClassifier,
    batch_size: int = 500,
) -> dict[str, Any]:
    """Judge generated digits with an MNIST classifier.

    Args:
        samples: generated images (N, 1, 28, 28) in [-1, 1].
        real_images: real images (M, 1, 28, 28) in [-1, 1] (uint8 is converted) to compare against.
        classifier: a trained :class:`MnistClassifier`.

    Returns a dict with:
        ``fd``: Fréchet distance between classifier features of samples and of real images;
        ``class_share``: 10 floats, the share of samples predicted as each digit;
        ``min_class_share`` / ``max_class_share``: its extremes (a collapsed mode shows as ~0);
        ``class_entropy``: entropy (nats) of ``class_share``, ``log(10) ~ 2.303`` when balanced;
        ``mean_confidence``: mean max softmax probability (recognisable digits score high, but so can
        far off-distribution inputs such as noise, so read it next to ``fd``);
        ``num_samples``, ``num_real``.
    """
    for name, t in (("samples", samples), ("real_images", real_images)):
        if t.ndim != 4 or t.shape[1:] != (1, 28, 28):
            raise ValueError(f"{name} must have shape (N, 1, 28, 28), got {tuple(t.shape)}")
    if real_images.dtype == torch.uint8:
        real_images = uint8_to_float(real_images)
    classifier.eval()
    sample_feats = compute_features(classifier.features, samples.float(), batch_size)
    real_feats = compute_features(classifier.features, real_images, batch_size)
    with torch.no_grad():
        # The head is a tiny linear layer: reuse the features rather than a second forward pass.
        head_device = classifier.head.weight.device
        probs = classifier.head(sample_feats.to(head_device)).float().softmax(dim=1).cpu()
    share = torch.bincount(probs.argmax(dim=1), minlength=MnistClassifier.num_classes).double() / len(probs)
    nonzero = share[share > 0]
    return {
        "fd": frechet_distance_from_features(sample_feats, real_feats),
        "class_share": share.tolist(),
        "min_class_share": float(share.min()),
        "max_class_share": float(share.max()),
        "class_entropy": float(-(nonzero * nonzero.log()).sum()),
        "mean_confidence": float(probs.max(dim=1).values.mean()),
        "num_samples": len(samples),
        "num_real": len(real_images),
    }


def format_evaluation(result: dict[str, Any]) -> str:
    """A short multi-line summary of :func:`evaluate_mnist_samples` output."""
    shares = " ".join(f"{d}:{s:.1%}" for d, s in enumerate(result["class_share"]))
    return "\n".join(
        [
            f"MNIST evaluation ({result['num_samples']} samples vs {result['num_real']} real)",
            f"  Frechet distance (classifier features): {result['fd']:.3f}",
            f"  mean confidence: {result['mean_confidence']:.3f}",
            f"  class entropy: {result['class_entropy']:.3f} nats (balanced = {math.log(10):.3f})",
            f"  class share min/max: {result['min_class_share']:.1%} / {result['max_class_share']:.1%}",
            f"  class shares: {shares}",
        ]
    )
