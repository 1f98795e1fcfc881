"""Evaluation during training (docs/evaluation.md): every N steps, score the sampling generator on a fixed
sample budget, log the scores as ``eval/<name>`` with the other metrics (the Fréchet distance as ``eval/fid``
in Inception features, ``eval/fd`` in others; precision and recall under names that say their features, e.g.
``eval/precision_vgg16-fc2``), and keep the best checkpoint (named in ``best.json``, never pruned while it is
the best).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import Tensor

from ..eval.distributed import generated_features
from ..eval.features import FeatureExtractor
from ..eval.scores import distance_name, pr_names, score_features
from ..processes import main_decides, run_together
from ..storage.layout import BEST, checkpoint_name, write_json
from .base import Callback

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

LOWER_IS_BETTER = {"fd": True, "fid": True, "kid": True, "precision": False, "recall": False, "is": False}


class Evaluator(Callback):
    """Scores samples of the sampling generator (the EMA when enabled) against reference features.

    Args:
        extractor: images (N, C, H, W) -> features (N, F); the reference was computed with it.
        reference: features (M, F) of real data.
        every: evaluate every ``every`` steps, and at the last step.
        num_samples: samples generated per evaluation (shared across processes).
        metric: the score that picks the best checkpoint: ``fd`` (the Fréchet distance, ``fid`` in Inception
            features), ``kid``, ``precision``, ``recall`` or ``is`` (``is`` needs ``logits``).
        logits: optional images -> class logits (N, K) for the Inception score.
        seed: the evaluation latents' seed (the same samples at every evaluation).
        features: the feature space's name: ``gan_accel.eval.INCEPTION_NAME`` for Inception's, whose Fréchet
            distance is logged as ``eval/fid``; any other keeps ``eval/fd``.
        pr_extractor, pr_reference, pr_features: where precision and recall are measured instead (the same
            samples, in one pass): an extractor, the real data's features in it and its name, e.g.
            ``vgg16_extractor()``, its features of the real data and ``VGG_NAME`` (the published protocol's).
        keep_best: write and keep the best checkpoint and ``best.json`` (its ``checkpoint`` is null when
            the ``checkpointer`` callback is switched off).

    The run's latent sampler must return one tensor per batch here (the evaluation slices it by sample).
    """

    def __init__(self, extractor: FeatureExtractor, reference: Tensor, *, every: int, num_samples: int = 2000,
                 metric: str = "fd", logits: Callable[[Tensor], Tensor] | None = None, seed: int = 1234,
                 keep_best: bool = True, batch_size: int = 250, features: str | None = None,
                 pr_extractor: FeatureExtractor | None = None, pr_reference: Tensor | None = None,
                 pr_features: str | None = None) -> None:
        if metric == "fid" and distance_name(features) != "fid":
            raise ValueError(f"metric='fid' is the Frechet distance in Inception features, and features={features!r}: "
                             "pass features=gan_accel.eval.INCEPTION_NAME with the Inception extractor, or metric='fd'")
        if (pr_extractor is None) != (pr_reference is None) or (pr_extractor is not None and not pr_features):
            raise ValueError("pr_extractor and pr_reference come together, with pr_features naming their space")
        if metric not in LOWER_IS_BETTER:
            raise ValueError(f"metric={metric!r} is unknown: choose one of {', '.join(LOWER_IS_BETTER)}")
        self.lower_is_better = LOWER_IS_BETTER[metric]
        # the distance, precision and recall under their names in their feature spaces
        pr = dict(zip(("precision", "recall"), pr_names(pr_features if pr_extractor is not None else features)))
        metric = {"fd": distance_name(features), **pr}.get(metric, metric)
        if metric == "is" and logits is None:
            raise ValueError("metric='is' needs logits= (the Inception score is computed from class logits)")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r} must be an integer >= 1 (steps between evaluations)")
        if not isinstance(num_samples, int) or num_samples < 2:
            raise ValueError(f"num_samples={num_samples!r} must be an integer >= 2")
        for name, ref in (("reference", reference), ("pr_reference", pr_reference)):
            if ref is not None and (ref.ndim != 2 or len(ref) < 2):
                raise ValueError(f"{name} must be features (M, F) with M >= 2, got shape {tuple(ref.shape)}")
        self.extractor, self.reference, self.logits = extractor, reference.float().cpu(), logits
        self.every, self.num_samples, self.metric, self.seed = every, num_samples, metric, seed
        self.keep_best, self.batch_size, self.features = keep_best, batch_size, features
        self.pr_extractor, self.pr_features = pr_extractor, pr_features
        self.pr_reference = None if pr_reference is None else pr_reference.float().cpu()
        self.best: dict[str, Any] | None = None  # {"step", "value", "checkpoint", "scores"}
        self.history: list[dict[str, Any]] = []
        self._new_best_step: int | None = None  # a new best whose checkpoint was asked for, not yet written

    # -- events --------------------------------------------------------------------------------
    def on_fit_start(self, trainer: "GANTrainer") -> None:
        if self.best is not None:  # resumed: the best as of the checkpoint (later ones may be set aside)
            if self.best["checkpoint"] is not None:
                trainer.control.keep_checkpoint(self.best["checkpoint"])
            run_together(trainer.accelerator, lambda: self._write_best(trainer))

    def on_step_end(self, trainer: "GANTrainer") -> None:
        step = trainer.step
        if step % self.every and step != trainer.config.max_steps:
            return
        scores = self.evaluate(trainer)
        trainer.control.log({**{f"eval/{k}": v for k, v in scores.items()}, "eval/step": step})
        self.history.append({"step": step, **scores})
        value, best = scores[self.metric], None if self.best is None else self.best["value"]
        if self.keep_best and (best is None or (value < best if self.lower_is_better else value > best)):
            # The new best is set before its checkpoint is written, so that checkpoint knows it is the
            # best (a resume from it keeps it); the old best is no longer protected from pruning.
            if self.best is not None and self.best["checkpoint"] is not None:
                trainer.control.release_checkpoint(self.best["checkpoint"])
            name = checkpoint_name(step)
            self.best = {"step": step, "metric": self.metric, "value": scores[self.metric], "checkpoint": name,
                         "scores": scores}
            trainer.control.keep_checkpoint(name)
            trainer.control.save_checkpoint()  # at this step, once on_step_end has run (none is written twice)
            self._new_best_step = step

    def on_checkpoint(self, trainer: "GANTrainer") -> None:
        """Name the new best's checkpoint in ``best.json`` (null when the ``checkpointer`` is switched off)."""
        if self._new_best_step != trainer.step:
            return
        self._new_best_step = None
        if trainer.state.last_checkpoint_step != trainer.step:
            trainer.control.release_checkpoint(self.best["checkpoint"])
            self.best["checkpoint"] = None
        self._write_best(trainer)  # on_checkpoint fires on every process together: failures are agreed

    # -- scoring -------------------------------------------------------------------------------
    def evaluate(self, trainer: "GANTrainer") -> dict[str, float]:
        """Collective: every process generates its share; the scores are returned on every process."""
        acc = trainer.accelerator

        def latents(_generator: torch.Generator, count: int) -> Any:
            return trainer.draw_latents(count, self.seed)  # the run's sampler on a private seed

        labels = None
        if trainer.conditioning.conditional:
            labels = torch.arange(self.num_samples) % trainer.config.num_classes
        # every extractor's features side by side: one pass over the samples; the logits take the last columns
        heads = [self.extractor] + [h for h in (self.pr_extractor, self.logits) if h is not None]
        widths = [self.reference.shape[1]] + ([self.pr_reference.shape[1]] if self.pr_extractor is not None else [])

        def joined(images: Tensor) -> Tensor:
            return torch.cat([head(images).float() for head in heads], dim=1)

        feats = generated_features(acc, trainer.sampling_generator(), joined if len(heads) > 1 else self.extractor,
                                   self.num_samples, latents=latents, labels=labels, seed=self.seed,
                                   batch_size=self.batch_size)

        def scores() -> dict[str, Any]:  # the main process scores; an error there is raised on every process
            parts = feats.split(widths + [feats.shape[1] - sum(widths)], dim=1)
            pr = dict(pr_fake=parts[1], pr_real=self.pr_reference, pr_features=self.pr_features) \
                if self.pr_extractor is not None else {}
            return score_features(parts[0], self.reference, parts[-1] if self.logits is not None else None,
                                  seed=self.seed, kid_subset_size=min(1000, self.num_samples, len(self.reference)),
                                  features=self.features, **pr)

        return main_decides(acc, scores)

    def _write_best(self, trainer: "GANTrainer") -> None:
        if not trainer.accelerator.is_main_process:
            return
        name = self.best["checkpoint"]
        write_json(trainer.output_dir / BEST, {**self.best, "checkpoint": name and f"checkpoints/{name}"})

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.history = state["best"], list(state["history"])
