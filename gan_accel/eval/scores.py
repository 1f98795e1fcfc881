"""All the sample-quality scores of one feature space at once."""

from __future__ import annotations

from torch import Tensor

from .frechet import frechet_distance_from_features
from .inception_score import inception_score
from .kid import kernel_inception_distance
from .precision_recall import precision_recall
from .random_features import INCEPTION_NAME


def distance_name(features: str | None) -> str:
    """The Fréchet distance's name in a feature space: ``fid`` in Inception's (the score papers report as FID),
    ``fd`` in any other (the MNIST classifier's, a random network's, yours), whose numbers are not FIDs."""
    return "fid" if features == INCEPTION_NAME else "fd"


def score_features(fake: Tensor, real: Tensor, fake_logits: Tensor | None = None, *, kid_subsets: int = 100,
                   kid_subset_size: int = 1000, pr_k: int = 3, is_splits: int = 10, seed: int = 0,
                   features: str | None = None) -> dict[str, float]:
    """Scores of generated features ``fake`` (N, F) against real ones ``real`` (M, F): ``fd`` (``fid`` when
    ``features``, the feature space's name, is :data:`INCEPTION_NAME`), ``kid`` and ``kid_std`` (lower is
    better), ``precision`` and ``recall`` (higher is better) and, with ``fake_logits`` (N, K), ``is`` and
    ``is_std``. Scores from different extractors are not comparable with each other.
    """
    if fake_logits is not None and len(fake_logits) != len(fake):
        raise ValueError(f"fake_logits must have one row per fake feature vector: got {len(fake_logits)} rows "
                         f"for {len(fake)} features")
    kid, kid_std = kernel_inception_distance(fake, real, kid_subsets, kid_subset_size, seed)
    precision, recall = precision_recall(fake, real, pr_k)
    scores = {distance_name(features): frechet_distance_from_features(fake, real), "kid": kid, "kid_std": kid_std,
              "precision": precision, "recall": recall}
    if fake_logits is not None:
        scores["is"], scores["is_std"] = inception_score(fake_logits, min(is_splits, len(fake_logits)))
    return scores
