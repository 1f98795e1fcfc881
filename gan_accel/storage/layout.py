"""The run folder's layout: every name gan_accel writes there, with the reader of each file others read.

One run folder (``TrainConfig.output_dir``)::

    <run>/
      config.json               the config in use now (its changes are dated in history.jsonl)    run_folder
      history.jsonl             one dated line per start, resume and fork                         run_folder
      .lock                     who holds the run (host, pid, since) while it trains              RunLock
      metrics.jsonl             one JSON row per log interval                                     MetricsLogger
      fixed_noise.safetensors   the progress samples' latents (fixed_labels.safetensors: labels)  run_folder
      samples_<step>.png        progress grids (or scatter plots; samples_<step>.pt otherwise)    SampleSaver
      samples_final.png, progress.gif                                                             SampleSaver
      training_plot.png         the metrics as line charts                                        TrainingPlot
      generator/                the finished run's G (the EMA when kept), as an export without card  WeightsExporter
      best.json                 the best evaluation and its checkpoint                            Evaluator
      eval.json                 a final evaluation (the MNIST examples' --eval)                   the examples
      data.json                 what an image run trained on: source, fingerprint, classes, ...   ImageData
      class_names.json          the class names, in label order (image runs with classes)         ImageData
      skipped_files.txt         the files of the data that are not readable images                ImageData
      trackers/                 files of the experiment trackers (trackers/runs.json: their ids)  TrackerLogger
      checkpoints/
        checkpoint_<step>/      one complete checkpoint (COMPLETE written last)                   Checkpointer
        .tmp-checkpoint_<step>/ a checkpoint being written

Inside a checkpoint: Accelerate's files (``model.safetensors`` is G, ``model_1.safetensors`` D, the
optimizers, schedulers, sampler and ``random_states_<rank>.pkl``), ``gan_accel_state_<rank>.safetensors``
(the trainer's own state on that process) and ``COMPLETE`` (JSON: step, processes, run id, config).

An export (:mod:`gan_accel.hub.export`) is ``config.json``, ``model.safetensors``, ``README.md`` and
``samples.png``. Everything that names one of these files takes the name from here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import reading
from .files import open_kept_file, write_bytes_synced
from .reading import MAX_LOG_BYTES, read_text

# -- the run folder -------------------------------------------------------------------------------------
CONFIG = "config.json"
HISTORY = "history.jsonl"
LOCK = ".lock"
METRICS = "metrics.jsonl"
FIXED_NOISE = "fixed_noise.safetensors"
FIXED_LABELS = "fixed_labels.safetensors"
GENERATOR = "generator"  # a folder: config.json + model.safetensors, the export format (gan_accel.hub)
BEST = "best.json"
EVAL = "eval.json"
HEALTH = "health.json"  # the health monitor's last probe of D and its warnings (gan_accel.callbacks.health)
TRAINING_PLOT = "training_plot.png"
PROGRESS_GIF = "progress.gif"
FINAL_SAMPLES = "samples_final"
TRACKERS = "trackers"
TRACKER_IDS = "runs.json"  # inside trackers/
CHECKPOINTS = "checkpoints"
DATA_RECORD = "data.json"  # written by gan_accel.data.ImageData.write_run_files
CLASS_NAMES = "class_names.json"
SKIPPED_FILES = "skipped_files.txt"
CHECKPOINT_PREFIX = "checkpoint_"
TMP_PREFIX = ".tmp-"

# -- inside a checkpoint --------------------------------------------------------------------------------
COMPLETE = "COMPLETE"
ENGINE_STATE = "gan_accel_state_{rank}.safetensors"
RAW_GENERATOR = "model.safetensors"  # Accelerate's name for the first prepared model, which is G
RNG_STATE = "random_states_{rank}.pkl"  # Accelerate's
EMA_STATE = "generator_ema"  # the EMA callback's state in an engine state (its "module": the EMA of G's tensors)

# -- an exported generator (gan_accel.hub) --------------------------------------------------------------
EXPORT_CONFIG = CONFIG
EXPORT_WEIGHTS = RAW_GENERATOR  # the Hugging Face name for a model's weights
EXPORT_CARD = "README.md"
EXPORT_SAMPLES = "samples.png"

# Names a run writes at its top level, and patterns of those it writes many of (and may replace or prune).
RUN_FILES = (CONFIG, METRICS, FIXED_NOISE, FIXED_LABELS, GENERATOR, EVAL, PROGRESS_GIF, BEST, TRAINING_PLOT,
             TRACKERS, DATA_RECORD, CLASS_NAMES, SKIPPED_FILES, HEALTH)
RUN_PATTERNS = ("samples_*.png", "samples_*.pt", f"{CHECKPOINTS}/{CHECKPOINT_PREFIX}*")
# Any of these marks a folder as a gan_accel run (config.json is written at a run's first step).
RUN_MARKS = (CONFIG, HISTORY, GENERATOR, METRICS)


def samples_stem(step: int | None) -> str:
    """``samples_000500`` for a step's progress samples, ``samples_final`` for the end of the run."""
    return FINAL_SAMPLES if step is None else f"samples_{step:06d}"


def checkpoint_root(run: str | os.PathLike) -> Path:
    return Path(run) / CHECKPOINTS


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint written at ``step``."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step of a checkpoint folder, from its name."""
    return int(Path(path).name[len(CHECKPOINT_PREFIX):])


def checkpoint_run_folder(checkpoint: str | os.PathLike) -> Path:
    """The run folder a checkpoint belongs to (``<run>/checkpoints/checkpoint_N``)."""
    checkpoint = Path(checkpoint)
    for parent in checkpoint.resolve().parents:
        if parent.name == CHECKPOINTS:
            return parent.parent
    return checkpoint.resolve().parent


def is_run_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding any file that marks a gan_accel run, or a checkpoints folder."""
    path = Path(path)
    return path.is_dir() and (any((path / name).exists() for name in RUN_MARKS) or checkpoint_root(path).is_dir())


# -- appended logs (metrics.jsonl, history.jsonl) -------------------------------------------------------
def append_line(path: str | os.PathLike, row: dict[str, Any]) -> None:
    """Append one JSON line and flush it to disk, so a crash loses at most the line being written. A last line
    left without its newline by a crash is completed first, so the new line never joins it."""
    fd = open_kept_file(path, os.O_RDWR | os.O_APPEND, Path(path).name)  # never appended through a link
    with os.fdopen(fd, "ab+") as handle:
        if handle.seek(0, os.SEEK_END) > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")  # in append mode every write goes to the end
        handle.write((json.dumps(row, sort_keys=True) + "\n").encode())
        handle.flush()
        os.fsync(handle.fileno())


append_metrics = append_line


def read_json_lines(path: str | os.PathLike) -> tuple[list[dict[str, Any]], int]:
    """(the lines that are JSON objects, how many other lines there were: cut short by a crash, or not rows)."""
    rows, skipped = [], 0
    if not Path(path).is_file():
        return rows, skipped
    for line in read_text(path, MAX_LOG_BYTES, errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            skipped += 1
    return rows, skipped


def skipped_rows_note(readable: int, skipped: int) -> str | None:
    """The note on a metrics log's unreadable lines: a few beside whole rows are a crash's cut-off line; a log with
    no whole row at all is damaged, or not a metrics log."""
    if not skipped:
        return None
    if not readable:
        return (f"{METRICS}: none of its {skipped} line(s) is a metrics row: it is damaged or not gan_accel's log; "
                "restore it from a copy, or move it away")
    return f"{METRICS}: {skipped} unreadable row(s) skipped (a row cut short by a crash?)"


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The whole rows of ``metrics.jsonl`` as the run stands; a line cut short by a crash is skipped."""
    return read_metrics_tolerant(path)[0]


def read_metrics_tolerant(path: str | os.PathLike) -> tuple[list[dict[str, Any]], int]:
    """(:func:`read_metrics`'s rows, how many lines were not whole). A resume logs again the steps after its
    checkpoint: a row of a later step number supersedes the rows the interrupted run logged from that step on."""
    rows, skipped = read_json_lines(path)
    kept: list[dict[str, Any]] = []
    for row in rows:
        step = row.get("step")
        while isinstance(step, int) and kept and isinstance(kept[-1].get("step"), int) and kept[-1]["step"] >= step:
            kept.pop()
        kept.append(row)
    return kept, skipped


# -- JSON files -------------------------------------------------------------------------------------------
def write_json(path: str | os.PathLike, value: Any) -> Path:
    """Write ``value`` as indented JSON, atomically and flushed to disk (a reader never sees half a file)."""
    write_bytes_synced(path, (json.dumps(value, indent=2, sort_keys=True, default=str) + "\n").encode())
    return Path(path)


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file of the run (config.json, best.json, eval.json, ...), through the one reader. Raises ``OSError``,
    ``ValueError``, or :class:`~gan_accel.errors.UnsafeFileError` for a FIFO, a device or a file too large."""
    return reading.read_json(path)
