"""Sample-quality evaluation over pluggable feature extractors. Imports nothing from the engine."""

from .features import FeatureExtractor, compute_features
from .frechet import feature_statistics, frechet_distance, frechet_distance_from_features

__all__ = ["FeatureExtractor", "compute_features", "feature_statistics", "frechet_distance",
           "frechet_distance_from_features"]
