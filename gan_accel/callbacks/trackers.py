"""Experiment trackers through Accelerate (TensorBoard, MLflow, W&B, trackio, Aim, Comet, ClearML, DVCLive,
SwanLab): the ``tracker_logger`` callback starts them with the run folder as project folder, logs the metrics
rows, the config and the progress samples, and finishes them (not ``accelerator.end_training()``, which also
destroys the process group a later ``fit()`` still needs). Trackers live on the main process only; a resumed
run continues the same tracker run where the tracker allows it (:func:`init_kwargs`).
"""

from __future__ import annotations

import json
import numbers
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UnsafeFileError
from ..storage.files import make_own_folder, write_bytes_synced
from ..storage.layout import TRACKER_IDS, TRACKERS
from ..storage.reading import read_json
from ..tracking import missing_tracker_warning, resolve_trackers, tracker_name
from .base import Callback
from .sample_saver import draw_samples

if TYPE_CHECKING:
    from ..engine.trainer import GANTrainer

IMAGE_KEY = "samples"
_STRICT_KEYS = ("mlflow", "swanlab")  # metric names limited to letters, digits and _ - . / space: "D(x)" -> "D_x"


def metric_key(tracker: str, key: str) -> str:
    """``key`` as ``tracker`` accepts it: MLflow and SwanLab refuse brackets, so ``D(G(z))`` becomes ``D_G_z``."""
    if tracker not in _STRICT_KEYS:
        return key
    return re.sub(r"[^0-9A-Za-z_\-./ ]+", "_", key).strip("_") or "_"


def flat_hyperparameters(config: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """A config dict as the flat ``{name: bool/int/float/str}`` every tracker takes (``extra.model.width``,
    tuples joined by commas, None left out)."""
    flat: dict[str, bool | int | float | str] = {}

    def add(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for inner, item in value.items():
                add(f"{key}.{inner}", item)
        elif isinstance(value, (list, tuple)):
            flat[metric_key("mlflow", key)] = ",".join(str(item) for item in value)
        elif isinstance(value, (bool, int, float, str)):
            flat[metric_key("mlflow", key)] = value

    for key, value in config.items():
        add(key, value)
    return flat


def init_kwargs(trainer: "GANTrainer", names: list[str], ids: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per-tracker arguments so files land in the run folder and a resumed run continues the tracker's run
    (TensorBoard hides events past the checkpoint; MLflow and Aim take the run id saved in ``runs.json``)."""
    folder, step, kwargs = trainer.output_dir / TRACKERS, trainer.step, {}
    if "tensorboard" in names and step > 0:
        kwargs["tensorboard"] = {"purge_step": step + 1}
    if "wandb" in names:
        wandb = {"id": trainer.state.run_id, "resume": "allow"} if trainer.state.run_id else {}
        kwargs["wandb"] = wandb if os.environ.get("WANDB_DIR") else {**wandb, "dir": str(folder)}
    if "dvclive" in names:
        kwargs["dvclive"] = {"dir": str(folder / "dvclive"), "resume": step > 0}
    if "mlflow" in names:
        kwargs["mlflow"] = {"run_id": ids["mlflow"]} if ids.get("mlflow") else {"run_name": trainer.output_dir.name}
    if "aim" in names and ids.get("aim"):
        kwargs["aim"] = {"run_hash": ids["aim"]}
    return kwargs


def sample_picture(trainer: "GANTrainer") -> Any:
    """The fixed-latent samples as an (H, W, 3) uint8 array: the picture ``samples_<step>.png`` shows (same pixels);
    None for samples that are neither images nor 2-D points."""
    import numpy as np
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        path = draw_samples(trainer, Path(tmp) / "samples")
        if path.suffix != ".png":
            return None
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB")).copy()


def log_picture(tracker: Any, picture: Any, step: int) -> bool:
    """Log an (H, W, 3) uint8 picture in the form ``tracker`` takes; False when it takes no images."""
    name = tracker_name(tracker)
    if name == "tensorboard":  # SummaryWriter.add_images wants a batch
        tracker.log_images({IMAGE_KEY: picture[None]}, step=step, dataformats="NHWC")
        tracker.writer.flush()
    elif name in ("aim", "clearml"):  # one image per key
        tracker.log_images({IMAGE_KEY: picture}, step=step)
    elif name == "mlflow":  # Accelerate's MLflow tracker has no log_images; mlflow itself has (>= 2.12)
        import mlflow

        if not hasattr(mlflow, "log_image"):
            return False
        mlflow.log_image(picture, key=IMAGE_KEY, step=step)
    elif callable(getattr(tracker, "log_images", None)):  # wandb, swanlab, custom trackers: a list of images
        tracker.log_images({IMAGE_KEY: [picture]}, step=step)
    else:
        return False
    return True


class TrackerLogger(Callback):
    """Logs the metrics rows, the config and the progress samples to the Accelerator's trackers (``log_with``);
    trackers you started before ``fit`` (``init_trackers``) are used as they are, and left open at the end."""

    def __init__(self) -> None:
        self._owned: list[Any] = []  # the trackers this callback started (and finishes)
        self._start_failed = False
        self._no_images: set[str] = set()

    def setup(self, trainer: "GANTrainer") -> None:
        if trainer.accelerator.is_main_process:
            for name in resolve_trackers(trainer.config.log_with)[1]:
                print(missing_tracker_warning(name), flush=True)

    def on_fit_start(self, trainer: "GANTrainer") -> None:
        acc = trainer.accelerator
        if not acc.is_main_process or acc.trackers or not acc.log_with:
            return
        names = [tracker_name(t) for t in acc.log_with]
        project, folder = trainer.config.tracker_project_name, trainer.output_dir / TRACKERS
        make_own_folder(folder, "the trackers' files")  # a link there would put them outside the run
        saved = _read_ids(folder)
        ids = saved.get(project, {})
        try:
            acc.init_trackers(project, init_kwargs=init_kwargs(trainer, names, ids))
        except BaseException:
            self._owned, self._start_failed = list(acc.trackers), True
            raise
        self._owned = list(acc.trackers)
        hyperparameters = flat_hyperparameters(trainer.config.to_dict())
        for tracker in self._owned:
            _store_config(tracker, hyperparameters, continued=tracker_name(tracker) in ids)
        ids = {**ids, **_run_ids(self._owned)}
        if ids:
            write_bytes_synced(folder / TRACKER_IDS,
                               (json.dumps({**saved, project: ids}, indent=1, sort_keys=True) + "\n").encode())

    def on_log(self, trainer: "GANTrainer", row: dict[str, Any]) -> None:
        values = {key: int(value) if isinstance(value, numbers.Integral) else float(value)  # non-finite ones too
                  for key, value in row.items()
                  if key != "step" and isinstance(value, numbers.Real) and not isinstance(value, bool)}
        for tracker in trainer.accelerator.trackers:
            tracker.log({metric_key(tracker_name(tracker), k): v for k, v in values.items()}, step=trainer.step)

    def on_sample(self, trainer: "GANTrainer") -> None:
        trackers = trainer.accelerator.trackers
        picture = sample_picture(trainer) if trackers else None
        if picture is None:
            return
        for tracker in trackers:
            name = tracker_name(tracker)
            if not log_picture(tracker, picture, trainer.step) and name not in self._no_images:
                self._no_images.add(name)
                print(f"gan_accel: note: tracker {name!r} takes no images through Accelerate; the progress samples "
                      f"are in {trainer.output_dir}", flush=True)

    def on_close(self, trainer: "GANTrainer") -> None:
        owned, self._owned = self._owned, []
        acc = trainer.accelerator
        acc.trackers = [t for t in acc.trackers if all(t is not o for o in owned)]
        for tracker in owned:
            try:
                tracker.finish()
            except Exception as error:  # the values are logged already: closing must not fail the run
                if not self._start_failed:
                    print(f"gan_accel: warning: tracker {tracker_name(tracker)!r} did not close cleanly: "
                          f"{type(error).__name__}: {error}", flush=True)
        self._start_failed = False


def _store_config(tracker: Any, values: dict[str, Any], continued: bool) -> None:
    """The hyperparameters; a continued MLflow run keeps the parameters it has (MLflow refuses to change one)."""
    if tracker_name(tracker) == "mlflow" and continued:
        import mlflow

        logged = mlflow.get_run(tracker.active_run.info.run_id).data.params
        changed = sorted(k for k, v in values.items() if k in logged and logged[k] != str(v))
        values = {k: v for k, v in values.items() if k not in logged}
        if changed:
            print(f"gan_accel: note: mlflow keeps a run's parameters: {', '.join(changed)} keep their first values "
                  "there (the changes are dated in history.jsonl)", flush=True)
    if values:
        tracker.store_init_configuration(values)


def _run_ids(trackers: list[Any]) -> dict[str, str]:
    ids = {}
    for tracker in trackers:
        name = tracker_name(tracker)
        if name == "mlflow":
            ids[name] = tracker.active_run.info.run_id
        elif name == "aim" and getattr(tracker.writer, "hash", None):
            ids[name] = tracker.writer.hash
    return ids


def _read_ids(folder: Path) -> dict[str, dict[str, str]]:
    """The tracker run ids a resume continues; anything but {project: {tracker: id}} is ignored (a new run)."""
    try:
        saved = read_json(folder / TRACKER_IDS)
    except (OSError, ValueError, UnsafeFileError):
        return {}
    if not isinstance(saved, dict):
        return {}
    return {project: {k: v for k, v in ids.items() if isinstance(k, str) and isinstance(v, str)}
            for project, ids in saved.items() if isinstance(ids, dict)}
