"""Evaluation during training: the logged scores are those of an independent computation, the best
checkpoint survives pruning and is named in best.json, and a resumed run keeps knowing it."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import Z_DIM, make_images, make_loader, make_models
from gan_accel import Callback, GANTrainer, TrainConfig, list_checkpoints
from gan_accel.callbacks import Evaluator
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.eval import INCEPTION_NAME, frechet_distance_from_features
from gan_accel.storage.checkpoint import read_engine_state


def flatten(images: torch.Tensor) -> torch.Tensor:
    return images.flatten(1).double()


def config_for(tmp_path, **overrides) -> TrainConfig:
    settings = dict(max_steps=6, batch_size=4, z_dim=Z_DIM, log_every=2, sample_every=100, checkpoint_every=100,
                    num_samples=4, output_dir=str(tmp_path / "run"), progress_bar=False)
    settings.update(overrides)
    return TrainConfig(**settings)


class ExpectedFD(Callback):
    """Computes, before the evaluator, the FD it should log: seeded randn latents through the sampling G."""

    name = "expected_fd"

    def __init__(self, reference: torch.Tensor, every: int, num: int, seed: int) -> None:
        self.reference, self.every, self.num, self.seed = reference, every, num, seed
        self.values: dict[int, float] = {}

    def on_step_end(self, trainer) -> None:
        if trainer.step % self.every:
            return
        G = trainer.sampling_generator()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            z = torch.randn(self.num, Z_DIM)
        with torch.no_grad():
            fake = G.eval()(z.to(next(G.parameters()).dtype))
        G.train()
        self.values[trainer.step] = frechet_distance_from_features(flatten(fake), self.reference)


@pytest.mark.parametrize("features, key, pr", [(None, "eval/fd", ""),
                                               (INCEPTION_NAME, "eval/fid", f"_{INCEPTION_NAME}")])
def test_logged_scores_equal_an_independent_computation(tmp_path, features, key, pr):
    """The Frechet distance is logged as eval/fid when the features are named Inception's, else eval/fd;
    precision and recall carry the name of a named feature space."""
    G, D = make_models(dtype=torch.float32)
    images = make_images(64, dtype=torch.float32)
    reference = flatten(images)
    expected = ExpectedFD(reference, every=2, num=50, seed=7)
    evaluator = Evaluator(flatten, reference, every=2, num_samples=50, seed=7, keep_best=False, features=features)
    trainer = GANTrainer(G, D, make_loader(images, 4), config_for(tmp_path), callbacks=[expected, evaluator])
    trainer.fit()
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval/step" in r]
    assert [r["eval/step"] for r in rows] == [2, 4, 6]
    for row in rows:
        assert row[key] == pytest.approx(expected.values[row["step"]], rel=1e-6)
        assert {"eval/kid", "eval/kid_std", f"eval/precision{pr}", f"eval/recall{pr}"} <= set(row)
        assert ({"eval/fd", "eval/fid"} - {key}).isdisjoint(row), "one name for the one distance"
    assert len({r[key] for r in rows}) == 3  # G moved between evaluations
    assert not (tmp_path / "run" / "best.json").exists()


def pooled(images: torch.Tensor) -> torch.Tensor:  # a second feature space, standing in for VGG-16 fc2
    return torch.nn.functional.avg_pool2d(images, 2).flatten(1)


def test_precision_and_recall_in_their_own_features_name_them(tmp_path):
    """With pr_extractor, precision and recall are those of the same samples in that space (as precision_recall
    computes them by hand), logged under names that say it; metric="precision" picks the best by them."""
    from gan_accel.eval import VGG_NAME, precision_recall

    G, D = make_models(dtype=torch.float32)
    images = make_images(64, dtype=torch.float32)
    seen: list[torch.Tensor] = []
    evaluator = Evaluator(flatten, flatten(images), every=3, num_samples=40, seed=7, metric="precision",
                          pr_extractor=lambda x: seen.append(x) or pooled(x), pr_reference=pooled(images),
                          pr_features=VGG_NAME)
    assert evaluator.metric == f"precision_{VGG_NAME}"
    trainer = GANTrainer(G, D, make_loader(images, 4), config_for(tmp_path), callbacks=[evaluator])
    trainer.fit()
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval/step" in r]
    assert len(rows) == 2 and not {"eval/precision", "eval/recall"} & set(rows[-1])
    samples = torch.cat(seen[-(len(seen) // 2):])  # the last evaluation's samples, as the extractor saw them
    expected = precision_recall(pooled(samples), pooled(images))
    assert (rows[-1][f"eval/precision_{VGG_NAME}"], rows[-1][f"eval/recall_{VGG_NAME}"]) == pytest.approx(expected)
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert best["metric"] == f"precision_{VGG_NAME}"
    with pytest.raises(ValueError, match="pr_extractor and pr_reference come together"):
        Evaluator(flatten, flatten(images), every=1, pr_extractor=pooled, pr_reference=pooled(images))


def test_the_fid_is_a_metric_in_inception_features_only():
    reference = torch.zeros(4, 16)
    assert Evaluator(flatten, reference, every=1, metric="fd", features=INCEPTION_NAME).metric == "fid"
    assert Evaluator(flatten, reference, every=1, metric="fid", features=INCEPTION_NAME).metric == "fid"
    assert Evaluator(flatten, reference, every=1, metric="fd", features="mnist-classifier").metric == "fd"
    with pytest.raises(ValueError, match="metric='fid' is the Frechet distance in Inception features"):
        Evaluator(flatten, reference, every=1, metric="fid", features="random-conv-v1")


class Scripted(Evaluator):
    """An evaluator whose scores are given, to place the best step where the test wants it."""

    name = "evaluator"

    def __init__(self, values: list[float], **kwargs) -> None:
        super().__init__(flatten, torch.zeros(4, 16, dtype=torch.float64), **kwargs)
        self.values = list(values)

    def evaluate(self, trainer) -> dict[str, float]:
        return {"fd": self.values[trainer.step // self.every - 1]}


def scripted_trainer(tmp_path, values: list[float]) -> GANTrainer:
    """8 steps, an evaluation and a checkpoint every 2, keep 1: without protection only checkpoint 8 is left."""
    G, D = make_models(dtype=torch.float32)
    return GANTrainer(G, D, make_loader(make_images(64, dtype=torch.float32), 4),
                      config_for(tmp_path, max_steps=8, checkpoint_every=2, keep_checkpoints=1),
                      callbacks=[Scripted(values, every=2)])


def test_best_checkpoint_is_kept_and_named(tmp_path):
    scripted_trainer(tmp_path, [5.0, 3.0, 4.0, 6.0]).fit()
    run = tmp_path / "run"
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint_00000004", "checkpoint_00000008"]
    best = json.loads((run / "best.json").read_text())
    assert best["step"] == 4 and best["value"] == 3.0 and best["metric"] == "fd"
    assert best["checkpoint"] == "checkpoints/checkpoint_00000004"
    # The best checkpoint's own state knows it is the best: a run resumed from it keeps it.
    state = read_engine_state(run / "checkpoints" / "checkpoint_00000004", 0)
    assert state["callbacks"]["evaluator"]["best"]["step"] == 4


def test_a_better_score_later_releases_the_old_best(tmp_path):
    scripted_trainer(tmp_path, [5.0, 3.0, 2.0, 6.0]).fit()
    run = tmp_path / "run"
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint_00000006", "checkpoint_00000008"]
    assert json.loads((run / "best.json").read_text())["step"] == 6


def test_resumed_run_keeps_protecting_the_best(tmp_path):
    scripted_trainer(tmp_path, [1.0, 3.0, 4.0, 6.0]).fit(stop_at_step=4)  # best at step 2
    scripted_trainer(tmp_path, [1.0, 3.0, 4.0, 6.0]).fit(resume_from="latest")
    run = tmp_path / "run"
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint_00000002", "checkpoint_00000008"]
    assert json.loads((run / "best.json").read_text())["step"] == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"metric": "sharpness"}, "metric='sharpness' is unknown"),
    ({"metric": "is"}, "needs logits="),
    ({"every": 0}, "every=0 must be an integer >= 1"),
    ({"num_samples": 1}, "num_samples=1 must be an integer >= 2"),
])
def test_bad_evaluator_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Evaluator(flatten, torch.zeros(4, 16), **{"every": 2, **kwargs})


def _two_process_evaluation(out_dir: str) -> None:
    from conftest import make_loader as loader_of

    G, D = make_models(dtype=torch.float32)
    images = make_images(64, dtype=torch.float32)
    reference = flatten(images)
    expected = ExpectedFD(reference, every=2, num=51, seed=7)  # every rank computes all 51 samples itself
    evaluator = Evaluator(flatten, reference, every=2, num_samples=51, seed=7)
    config = TrainConfig(max_steps=4, batch_size=4, z_dim=Z_DIM, log_every=2, sample_every=100, checkpoint_every=100,
                         num_samples=4, output_dir=out_dir, progress_bar=False)
    trainer = GANTrainer(G, D, loader_of(images, 4), config, callbacks=[expected, evaluator])
    trainer.fit()
    rank = trainer.accelerator.process_index
    torch.save({"history": evaluator.history, "best": evaluator.best, "expected": expected.values},
               f"{out_dir}/eval_{rank}.pt")


@pytest.mark.slow
def test_two_processes_share_the_samples_and_agree_on_the_scores(tmp_path):
    from conftest import launch_two_processes

    launch_two_processes(_two_process_evaluation, args=(str(tmp_path),))
    rank0, rank1 = (torch.load(tmp_path / f"eval_{r}.pt", weights_only=False) for r in (0, 1))
    assert rank0["history"] == rank1["history"] and rank0["best"] == rank1["best"]
    for entry in rank0["history"]:  # 26 + 25 samples generated apart, scored as the 51 of one process
        assert entry["fd"] == pytest.approx(rank0["expected"][entry["step"]], rel=1e-6)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["step"] == rank0["best"]["step"] and (tmp_path / best["checkpoint"]).is_dir()


def test_best_without_checkpoints_is_named_but_points_nowhere(tmp_path):
    G, D = make_models(dtype=torch.float32)
    GANTrainer(G, D, make_loader(make_images(64, dtype=torch.float32), 4), config_for(tmp_path, max_steps=4),
               callbacks=[Scripted([2.0, 1.0], every=2)], disable_callbacks=("checkpointer",)).fit()
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert best["step"] == 4 and best["checkpoint"] is None
    assert not (tmp_path / "run" / "checkpoints").exists()
