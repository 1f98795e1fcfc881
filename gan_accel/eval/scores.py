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


def pr_names(features: str | None) -> tuple[str, str]:
    """Precision and recall's names, which say their feature space: ``precision_<space>`` and ``recall_<space>``
    (``precision_vgg16-fc2`` in the published protocol's), plain ``precision`` and ``recall`` in an unnamed one."""
    return ("precision", "recall") if features is None else (f"precision_{features}", f"recall_{features}")


def score_features(fake: Tensor, real: Tensor, fake_logits: Tensor | None = None, *, kid_subsets: int = 100,
                   kid_subset_size: int = 1000, pr_k: int = 3, is_splits: int = 10, seed: int = 0,
                   features: str | None = None, pr_fake: Tensor | None = None, pr_real: Tensor | None = None,
                   pr_features: str | None = None) -> dict[str, float]:
    """Scores of generated features ``fake`` (N, F) against real ones ``real`` (M, F): ``fd`` (``fid`` when
    ``features``, the feature space's name, is :data:`INCEPTION_NAME`), ``kid`` and ``kid_std`` (lower is
    better), precision and recall (higher is better) and, with ``fake_logits`` (N, K), ``is`` and ``is_std``.
    Precision and recall are measured in ``pr_fake`` and ``pr_real`` when given (the features of the same
    samples in space ``pr_features``, e.g. VGG-16 fc2), else in ``fake`` and ``real``; their names say the space
    (:func:`pr_names`). Scores from different extractors are not comparable with each other.
    """
    if fake_logits is not None and len(fake_logits) != len(fake):
        raise ValueError(f"fake_logits must have one row per fake feature vector: got {len(fake_logits)} rows "
                         f"for {len(fake)} features")
    if (pr_fake is None) != (pr_real is None) or (pr_fake is not None and pr_features is None):
        raise ValueError("pr_fake and pr_real come together, with pr_features naming their feature space")
    if pr_fake is not None and len(pr_fake) != len(fake):
        raise ValueError(f"pr_fake must have one row per fake feature vector: got {len(pr_fake)} for {len(fake)}")
    kid, kid_std = kernel_inception_distance(fake, real, kid_subsets, kid_subset_size, seed)
    precision, recall = precision_recall(fake if pr_fake is None else pr_fake, real if pr_real is None else pr_real,
                                         pr_k)
    names = pr_names(features if pr_fake is None else pr_features)
    scores = {distance_name(features): frechet_distance_from_features(fake, real), "kid": kid, "kid_std": kid_std,
              names[0]: precision, names[1]: recall}
    if fake_logits is not None:
        scores["is"], scores["is_std"] = inception_score(fake_logits, min(is_splits, len(fake_logits)))
    return scores
