"""Differentiable augmentation for D (pure modules: nothing here knows of Accelerate or the engine).

An augmentation is ``augment(x) -> x'`` with a probability attribute ``p`` (:class:`Augment`):
``"none"`` (:class:`NoAugment`), ``"diffaugment"`` (:class:`DiffAugment`: colour, translation,
cutout) or ``"ada"`` (:class:`AdaAugment`, whose ``p`` :class:`AdaptiveP` adjusts from D's real logits).
"""

from __future__ import annotations

from typing import Any

from .ada import AdaAugment, AdaDraws
from .adaptive import AdaptiveP
from .base import Augment, NoAugment
from .diffaugment import DiffAugment

AUGMENTS = ("none", "diffaugment", "ada")


def build_augment(name: str, **options: Any) -> Augment:
    """The augmentation ``name`` ("none", "diffaugment" or "ada", at ``p=0`` unless given) with its options."""
    if name == "none":
        if options:
            raise ValueError(f"--augment none takes no options, got {', '.join(sorted(options))}")
        return NoAugment()
    if name == "diffaugment":
        return DiffAugment(**options)
    if name == "ada":
        return AdaAugment(**options)
    raise ValueError(f"unknown augmentation {name!r}: choose one of {', '.join(AUGMENTS)}")


__all__ = ["Augment", "NoAugment", "DiffAugment", "AdaAugment", "AdaDraws", "AdaptiveP", "AUGMENTS", "build_augment"]
