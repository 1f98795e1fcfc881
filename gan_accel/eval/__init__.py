"""Sample-quality evaluation over pluggable feature extractors. Imports nothing from the engine."""

from .features import FeatureExtractor, compute_features
from .frechet import feature_statistics, frechet_distance, frechet_distance_from_features
from .distributed import gather_exact, generated_features, share_of
from .inception_score import inception_score
from .kid import kernel_inception_distance
from .precision_recall import precision_recall
from .random_features import INCEPTION_NAME
from .scores import distance_name, pr_names, score_features
from .inception import InceptionUnavailable, inception_extractor
from .vgg import VGG_NAME, VGGUnavailable, vgg16_extractor

__all__ = ["FeatureExtractor", "compute_features", "feature_statistics", "frechet_distance",
           "frechet_distance_from_features", "gather_exact", "generated_features", "share_of",
           "inception_score", "kernel_inception_distance", "precision_recall", "score_features",
           "INCEPTION_NAME", "distance_name", "pr_names",
           "InceptionUnavailable", "inception_extractor", "VGG_NAME", "VGGUnavailable", "vgg16_extractor"]
