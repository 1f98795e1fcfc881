"""Experiment trackers through Accelerate: TensorBoard and MLflow at once, read back from their own files.

What the ``trackers`` callback promises: every numeric value of every metrics row reaches each tracker at
the row's step (the same values as ``metrics.jsonl``), the progress samples reach the trackers that take
images (the same pixels as ``samples_<step>.png``), a resumed run continues the same tracker run, a
missing package is one warning line, and a wrong tracker name is one ConfigError line.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

from conftest import Z_DIM, TableLatents, launch_two_processes, make_images, make_loader, make_models
from gan_accel import ConfigError, GANTrainer, TrainConfig
from gan_accel import tracking as trackers_module
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.callbacks.trackers import flat_hyperparameters, metric_key
from gan_accel.storage.layout import TRACKERS
from gan_accel.tracking import BUILTIN_TRACKERS
from gan_accel.config import compare_configs

ROOT = Path(__file__).resolve().parents[1]


def trainer_for(out_dir: Path, **overrides) -> GANTrainer:
    cfg = dict(max_steps=4, batch_size=4, z_dim=Z_DIM, log_every=1, sample_every=2, checkpoint_every=2,
               num_samples=4, output_dir=str(out_dir), progress_bar=False, tracker_project="proj")
    cfg.update(overrides)
    G, D = make_models()
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(make_images(64), cfg["batch_size"]), TrainConfig(**cfg), latent_sampler=latents)
    latents.rewind()
    return trainer


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """MLflow on a local file store, offline (no telemetry)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps the file store behind this switch
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    return mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri())


def tensorboard_events(run: Path, project: str = "proj"):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / TRACKERS / project), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


def numeric(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def assert_tensorboard_has_the_rows(events, rows: list[dict]) -> None:
    for key in numeric(rows[0]):
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [row["step"] for row in rows], key
        for scalar, row in zip(scalars, rows):  # TensorBoard stores float32
            assert scalar.value == pytest.approx(np.float32(row[key]), nan_ok=True, rel=1e-6), (key, row["step"])


def decoded(png: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_tensorboard_and_mlflow_at_once_get_every_metrics_row_and_the_sample_grids(tmp_path, mlflow_store):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    trainer = trainer_for(run, log_with=("tensorboard", "mlflow"))
    assert [str(t.value) for t in trainer.accelerator.log_with] == ["tensorboard", "mlflow"]
    trainer.fit()
    rows = read_metrics(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]

    events = tensorboard_events(run)
    assert_tensorboard_has_the_rows(events, rows)
    images = events.Images("samples")
    assert [image.step for image in images] == [2, 4]
    for image in images:  # the very pixels of the grid the run folder holds
        png = (run / f"samples_{image.step:06d}.png").read_bytes()
        assert np.array_equal(decoded(image.encoded_image_string), decoded(png))

    (experiment,) = [e for e in mlflow_store.search_experiments() if e.name == "proj"]
    (mlrun,) = mlflow_store.search_runs([experiment.experiment_id])
    for key in numeric(rows[0]):
        history = mlflow_store.get_metric_history(mlrun.info.run_id, metric_key("mlflow", key))
        assert [m.step for m in history] == [row["step"] for row in rows], key
        assert [m.value for m in history] == pytest.approx([row[key] for row in rows], nan_ok=True, rel=1e-12)
    assert mlrun.data.params["lr_G"] == str(trainer.config.lr_G)
    assert mlrun.data.params["betas_G"] == "0.5,0.999"
    assert mlrun.data.params["log_with"] == "tensorboard,mlflow"
    assert mlflow_store.list_artifacts(mlrun.info.run_id, "images"), "the sample grids reach MLflow as images"
    assert trainer.accelerator.trackers == []  # finished at the end of fit, and a later fit() starts them again


def test_a_resumed_run_continues_the_same_tracker_runs_and_hides_the_steps_logged_after_its_checkpoint(
        tmp_path, mlflow_store):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    trainer_for(run, max_steps=6, keep_checkpoints=3, log_with=("tensorboard", "mlflow")).fit()
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    for step in (4, 6):  # as a crash right after checkpoint 2 leaves the run: rows 3..6 logged, no later checkpoint
        shutil.rmtree(run / "checkpoints" / f"checkpoint_{step:08d}")
    resumed = trainer_for(run, max_steps=6, keep_checkpoints=3, log_with=("tensorboard", "mlflow"), lr_G=1e-3)
    resumed.fit(resume_from="latest")  # steps 3..6 again
    rows = read_metrics(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    # TensorBoard: purge_step hides the first steps 3..6; each step once, with the resumed run's values.
    assert_tensorboard_has_the_rows(tensorboard_events(run), rows)
    # MLflow: the same run continues (its id is kept in <run>/trackers/runs.json); its params keep their first values.
    (experiment,) = [e for e in mlflow_store.search_experiments() if e.name == "proj"]
    (mlrun,) = mlflow_store.search_runs([experiment.experiment_id])
    history = mlflow_store.get_metric_history(mlrun.info.run_id, "loss/D")
    assert sorted({m.step for m in history}) == [1, 2, 3, 4, 5, 6]
    last = {m.step: m.value for m in sorted(history, key=lambda m: m.timestamp)}
    assert [last[row["step"]] for row in rows] == pytest.approx([row["loss/D"] for row in rows], rel=1e-12)
    assert mlrun.data.params["lr_G"] == str(2e-4)


def test_trackers_are_closed_after_an_error_and_closing_twice_is_harmless(tmp_path):
    pytest.importorskip("tensorboard")
    from gan_accel import Callback, CallbackError

    class FailAtStep2(Callback):
        def on_step_end(self, trainer):
            if trainer.step == 2:
                raise RuntimeError("boom")

    run = tmp_path / "run"
    trainer = trainer_for(run, log_with=("tensorboard",))
    trainer.callbacks.add(FailAtStep2())
    with pytest.raises(CallbackError, match="boom"):
        trainer.fit()
    assert trainer.accelerator.trackers == []
    trainer.callbacks.fire("on_close")  # nothing left to finish
    assert [s.step for s in tensorboard_events(run).Scalars("loss/D")] == [1]  # written and closed


def test_a_missing_tracker_package_is_one_warning_line_naming_its_extra_and_training_goes_on(tmp_path, monkeypatch,
                                                                                            capsys):
    monkeypatch.setattr(trackers_module, "tracker_available", lambda name: False)
    trainer = trainer_for(tmp_path / "run", log_with=("wandb",), max_steps=2)
    assert trainer.accelerator.log_with == []
    trainer.fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if "wandb" in line]
    assert lines == ["gan_accel: warning: tracker 'wandb' needs its package: pip install 'gan_accel[wandb]'; "
                     "training continues without it"]
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 2


def test_every_tracker_accelerate_ships_has_a_pip_extra_of_its_name():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [name for name in BUILTIN_TRACKERS if name not in extras] == []
    from accelerate.utils import LoggerType

    assert {t.value for t in LoggerType} - {"all"} <= set(BUILTIN_TRACKERS)


def test_an_unknown_tracker_is_one_config_error_line_listing_the_choices():
    with pytest.raises(ConfigError) as error:
        TrainConfig(log_with=("tensorbord",))
    message = str(error.value)
    assert "\n" not in message and "'tensorbord'" in message
    assert all(name in message for name in ("tensorboard", "mlflow", "wandb", "all"))
    with pytest.raises(ConfigError, match="tracker_project"):
        TrainConfig(tracker_project="")


def test_log_with_survives_the_json_round_trip_and_may_change_on_resume():
    config = TrainConfig(log_with="tensorboard, mlflow", output_dir="runs/x")
    assert config.log_with == ("tensorboard", "mlflow") and config.tracker_project_name == "x"
    again = TrainConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    saved = TrainConfig(output_dir="runs/x").to_dict()
    del saved["log_with"], saved["tracker_project"]  # a checkpoint from before trackers
    assert compare_configs(saved, TrainConfig(output_dir="runs/x").to_dict()) == ([], {})
    refused, changed = compare_configs(saved, config.to_dict())
    assert refused == [] and changed == {"log_with": [None, ["tensorboard", "mlflow"]]}


def test_hyperparameters_are_flat_scalars_and_metric_names_fit_mlflow():
    flat = flat_hyperparameters(TrainConfig(extra={"model": {"width": 8}}, log_with=("tensorboard",)).to_dict())
    assert flat["betas_D"] == "0.5,0.999" and flat["extra.model.width"] == 8 and "ema_decay" not in flat
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
    assert [metric_key("mlflow", k) for k in ("D(x)", "D(G(z))", "loss/D", "images/s")] == \
        ["D_x", "D_G_z", "loss/D", "images/s"]
    assert metric_key("tensorboard", "D(x)") == "D(x)"


def test_your_own_accelerator_must_log_with_the_trackers_the_config_asks_for(tmp_path, monkeypatch):
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin

    monkeypatch.setattr(trackers_module, "tracker_available", lambda name: name == "tensorboard")
    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1,
                                                                                      sync_with_dataloader=False))
    config = TrainConfig(max_steps=2, batch_size=4, z_dim=Z_DIM, output_dir=str(tmp_path / "run"),
                         progress_bar=False, log_with=("tensorboard",))
    G, D = make_models()
    with pytest.raises(ConfigError, match=r"asks for tensorboard but the Accelerator you passed logs with no tracker"):
        GANTrainer(G, D, make_loader(make_images(16), 4), config, accelerator=accelerator)


def test_the_examples_log_with_flag_reaches_tensorboard(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import dcgan_mnist

    from gan_accel.data import resolve_dataset

    small = lambda *args, **kwargs: resolve_dataset(*args, **kwargs, offline_size=256)  # noqa: E731
    monkeypatch.setattr(dcgan_mnist, "resolve_dataset", small)  # 256 offline digits: seconds, not a minute
    assert dcgan_mnist.parse_args(["--log-with", "tensorboard,mlflow", "wandb"]).log_with == ["tensorboard,mlflow",
                                                                                             "wandb"]

    run = tmp_path / "run"
    code = dcgan_mnist.main(["--dataset", "digits", "--data-dir", str(tmp_path / "data"), "--output-dir", str(run),
                             "--steps", "2", "--batch-size", "8", "--width", "8", "--log-every", "1",
                             "--sample-every", "2", "--no-progress", "--ema-decay", "0", "--log-with", "tensorboard",
                             "--tracker-project", "proj"])
    assert code == 0
    events = tensorboard_events(run)
    assert [s.step for s in events.Scalars("loss/D")] == [1, 2]
    assert [image.step for image in events.Images("samples")] == [2]


def _two_process_run(out_dir: str) -> None:
    from accelerate import PartialState

    trainer = trainer_for(Path(out_dir) / "run", log_with=("tensorboard",), batch_size=2)
    started = []
    trainer.callbacks.add(type("Probe", (), {"name": "probe", "on_fit_start": lambda self, t: started.append(
        len(t.accelerator.trackers))})())
    trainer.fit()
    (Path(out_dir) / f"trackers_rank{PartialState().process_index}.json").write_text(json.dumps(started))


@pytest.mark.slow
def test_two_processes_log_once_from_the_main_process(tmp_path):
    pytest.importorskip("tensorboard")
    launch_two_processes(_two_process_run, (str(tmp_path),))
    run = tmp_path / "run"
    rows = read_metrics(run / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    events = tensorboard_events(run)
    assert_tensorboard_has_the_rows(events, rows)  # one writer: each step once
    writers = [p for p in (run / TRACKERS / "proj").iterdir() if p.name.startswith("events.out")]
    assert len(writers) == 1
    assert [json.loads((tmp_path / f"trackers_rank{rank}.json").read_text()) for rank in (0, 1)] == [[1], [0]]
