"""``gan-accel info RUN``: what a run folder holds, read-only (also while the run is training).

The config's key fields, the steps done of ``max_steps``, the last metrics row, the checkpoints,
the best checkpoint (``best.json``), the evaluation results (``eval.json``), D's health and the health
warnings (``health.json``) and the run's history
(``history.jsonl``: its start or fork, its resumes, their config changes). ``--json``
prints the same as one JSON object. Nothing in the folder is written, locked or created.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import GanAccelError
from ..storage.checkpoint import list_checkpoints, read_marker
from ..storage.layout import (BEST, CONFIG, EVAL, GENERATOR, HEALTH, HISTORY, METRICS, checkpoint_step,
                            read_json, read_json_lines, read_metrics_tolerant, skipped_rows_note)
from ..storage.lock import recorded_holder
from ..text import printable
from .common import resolve_run

KEY_FIELDS = ("max_steps", "batch_size", "grad_accum_steps", "n_critic", "loss", "z_dim", "lr_G", "lr_D",
              "lr_schedule", "warmup_ratio", "ema_decay", "ema_half_life", "r1_gamma", "r1_every", "gp_weight",
              "num_classes", "label_distribution", "class_loss_weight", "mixed_precision", "seed", "log_every",
              "checkpoint_every", "keep_checkpoints", "model")
EXTRA_FIELDS = ("dataset", "num_processes")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "info", help="describe a run folder: config, steps, last metrics, checkpoints, best, evaluation, history",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN", help="a run folder (the --output-dir of a training run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = describe_run(resolve_run(args.run_dir, "info"))
    print(json.dumps(report, indent=2, sort_keys=True, default=str) if args.json else format_report(report))
    return 0


# -- reading -----------------------------------------------------------------------------------------
def describe_run(run: Path) -> dict[str, Any]:
    """Everything ``info`` reports, as a JSON-able dict (files that cannot be read are noted, not fatal)."""
    notes: list[str] = []
    rows, skipped = read_metrics_tolerant(run / METRICS)
    if skipped:
        notes.append(skipped_rows_note(len(rows), skipped))
    export = _export(run, notes)
    checkpoints = list_checkpoints(run)
    config = _config(run, export, checkpoints, notes)
    last = rows[-1] if rows else None
    steps = {"last_metrics_row": last.get("step") if last else None,
             "latest_checkpoint": checkpoint_step(checkpoints[-1]) if checkpoints else None,
             "exported": export["step"] if export else None}
    done = max((s for s in steps.values() if isinstance(s, int)), default=0)
    if export:
        export.pop("config", None)
    max_steps = config.get("max_steps")
    best = _json_file(run / BEST, notes)
    return {
        "run": str(run),
        "status": _status(run, done, max_steps, export, checkpoints),
        "steps": {"done": done, "max_steps": max_steps, **steps},
        "config": {k: config[k] for k in KEY_FIELDS if k in config},
        "extra": {k: config.get("extra", {})[k] for k in EXTRA_FIELDS if k in config.get("extra", {})},
        "metrics_rows": len(rows),
        "last_metrics": last,
        "checkpoints": [_checkpoint(p) for p in checkpoints],
        "best": best,
        "eval": _json_file(run / EVAL, notes),
        "health": _json_file(run / HEALTH, notes),
        "export": export,
        "history": _history(run / HISTORY, notes),
        "notes": notes,
    }


def _export(run: Path, notes: list[str]) -> dict[str, Any] | None:
    from ..hub.load import read_export_config

    path = run / GENERATOR
    if not path.is_dir():
        return None
    try:
        info = read_export_config(path)
    except GanAccelError as error:
        notes.append(str(error))
        return {"path": str(path), "step": None, "ema": None}
    return {"path": str(path), "step": info["weights"].get("step"), "ema": info["weights"].get("ema"),
            "config": info.get("training")}


def _config(run: Path, export: dict[str, Any] | None, checkpoints: list[Path], notes: list[str]) -> dict[str, Any]:
    """config.json (the config in use now); else the export's or the latest checkpoint's."""
    config = _json_file(run / CONFIG, notes)
    if isinstance(config, dict):
        return config
    if config is not None:
        notes.append(f"{CONFIG} is not a JSON object: the config shown is the export's or the latest checkpoint's")
    if export and isinstance(export.get("config"), dict):
        return export["config"]
    if checkpoints:
        return read_marker(checkpoints[-1]).get("config") or {}
    return {}


def _json_file(path: Path, notes: list[str]) -> Any:
    if not os.path.lexists(path):
        return None
    try:
        return read_json(path)
    except (OSError, ValueError, GanAccelError) as error:
        notes.append(f"{path.name} is unreadable: {error}")
        return None


def _checkpoint(path: Path) -> dict[str, Any]:
    marker = read_marker(path)
    return {"name": path.name, "step": checkpoint_step(path), "path": str(path),
            "num_processes": marker.get("num_processes")}


def _history(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    if os.path.lexists(path) and not path.is_file():
        notes.append(f"{HISTORY} is not a regular file (a FIFO, device, folder or dangling link): not read")
    events, skipped = read_json_lines(path)
    notes += [f"{HISTORY}: an unreadable line skipped"] * skipped
    for entry in events:
        entry.pop("config", None)  # the whole config of a start or fork: config.json and the checkpoints hold it
    return events


def _status(run: Path, done: int, max_steps: Any, export: dict[str, Any] | None,
            checkpoints: list[Path]) -> dict[str, Any]:
    holder = recorded_holder(run)
    if holder is not None and holder.get("alive") is not False:
        where = "" if holder.get("alive") else " (on another host: cannot check that it still runs)"
        return {"state": "running", "holder": holder,
                "text": f"in progress: pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}{where}"}
    finished = export is not None and isinstance(max_steps, int) and done >= max_steps
    if finished:
        return {"state": "finished", "text": "finished"}
    text = f"stopped at step {done}" + (f" of {max_steps}" if max_steps else "")
    if holder is not None:
        text += f" (its process, pid {holder.get('pid')}, ended without finishing: killed or crashed)"
    if checkpoints:
        text += "; continue it with --resume latest"
    else:
        text += "; it wrote no checkpoint: " + ("the command that started it starts it again there" if holder
                                                 else "there is nothing to resume")
    return {"state": "stopped", "holder": holder, "text": text}


# -- printing ----------------------------------------------------------------------------------------
def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _config_line(config: dict[str, Any], extra: dict[str, Any]) -> list[str]:
    """The key fields that are set, as ``name value`` pairs; then the model and the data."""
    parts = [f"{name} {_number(value)}" for name, value in config.items() if name != "model" and value is not None]
    if "num_processes" in extra:
        parts.append(f"{extra['num_processes']} process(es)")
    lines = ["config: " + ", ".join(parts)]
    model = config.get("model")
    what = []
    if isinstance(model, dict):
        classes = model.get("num_classes")
        kind = f"{model.get('family', 'dcgan')}" + (f", conditional on {classes} classes" if classes else "")
        what.append(f"{kind}, width {model.get('width')}, {model.get('image_size')}x{model.get('image_size')}x"
                    f"{model.get('channels')}")
    if "dataset" in extra:
        what.append(f"data {extra['dataset']}")
    return lines + (["model: " + ", ".join(what)] if what else [])


def _health_lines(health: Any) -> list[str]:
    """D's last probe (spread, overfitting, r_t) and every health warning of the run, from ``health.json``."""
    if not isinstance(health, dict):
        return []
    lines = []
    probe = health.get("d_probe")
    if isinstance(probe, dict) and probe:
        values = ", ".join(f"{key} {_number(probe[f'health/{key}'])}" for key in ("d_spread", "overfit", "rt",
                           "d_real", "d_fake", "d_heldout") if f"health/{key}" in probe)
        held = health.get("held_out")
        check = f"{held} held-out images" if held else "no held-out images: the overfitting check is off"
        lines.append(f"D's health (step {probe.get('step')}; {check}): {values}")
    warnings = [w for w in health.get("warnings") or [] if isinstance(w, dict)]
    lines.append(f"health warnings: {len(warnings) or 'none'}")
    lines += [f"  step {w.get('step')}: {w.get('line')}" for w in warnings]
    return lines


def _event_line(event: dict[str, Any]) -> str:
    kind = event.get("event")
    text = f"{event.get('time', '?')} {kind}"
    if kind == "resume":
        text += f" at step {event.get('step')} from {Path(str(event.get('checkpoint'))).name}"
    elif kind == "fork":
        text += f" from {event.get('source')} (step {event.get('step')})"
    elif kind == "restart":
        text += " of the run killed before its first checkpoint (what it wrote replaced)"
    changes = event.get("changes")
    if isinstance(changes, dict) and changes:
        text += ": " + ", ".join(f"{k} {_pair(v)}" for k, v in sorted(changes.items()))
    return text


def _pair(value: Any) -> str:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return f"{value[0]!r} -> {value[1]!r}"
    return repr(value)


def format_report(report: dict[str, Any]) -> str:
    steps, status = report["steps"], report["status"]
    lines = [f"run {report['run']}: {status['text']}"]
    lines += _config_line(report["config"], report["extra"])
    sources = [f"{name.replace('_', ' ')} {steps[name]}" for name in ("last_metrics_row", "latest_checkpoint", "exported")
               if steps[name] is not None]
    lines.append(f"steps: {steps['done']} / {steps['max_steps']}" + (f" ({', '.join(sources)})" if sources else ""))
    last = report["last_metrics"]
    if last:
        values = "  ".join(f"{k}={_number(v)}" for k, v in sorted(last.items()) if k != "step")
        lines.append(f"last metrics (step {last.get('step')}, row {report['metrics_rows']}): {values}")
    else:
        lines.append(f"last metrics: none ({METRICS} is missing or empty)")
    export = report["export"]
    if export:
        what = {True: "the EMA of G", False: "the raw G"}.get(export.get("ema"), "G")
        lines.append(f"weights: {GENERATOR}/ ({what}, step {export.get('step')})")
    else:
        lines.append(f"weights: no {GENERATOR}/ yet (written when training ends)")
    best = report["best"]
    best_name = Path(str(best.get("checkpoint"))).name if isinstance(best, dict) and best.get("checkpoint") else None
    names = [c["name"] + (" (best)" if c["name"] == best_name else "") for c in report["checkpoints"]]
    lines.append("checkpoints: " + (", ".join(names) if names else "none"))
    if isinstance(best, dict):
        kept = f"{best_name}" if best_name else "no checkpoint (checkpoints were switched off)"
        lines.append(f"best: {best.get('metric')} {_number(best.get('value'))} at step {best.get('step')}, {kept}")
    evaluation = report["eval"]
    if isinstance(evaluation, dict):
        summary = evaluation.get("summary")
        if isinstance(summary, str):
            lines.append(f"evaluation ({EVAL}):")
            lines += [f"  {line}" for line in summary.splitlines()]
        else:
            scalars = ", ".join(f"{k} {_number(v)}" for k, v in sorted(evaluation.items())
                                if isinstance(v, (int, float, str)))
            lines.append(f"evaluation ({EVAL}): {scalars}")
    lines += _health_lines(report.get("health"))
    if report["history"]:
        lines.append("history:")
        lines += [f"  {_event_line(event)}" for event in report["history"]]
    lines += [f"note: {note}" for note in report["notes"]]
    # The values come from the run's files: a terminal's control characters in them are shown as escapes,
    # and a newline inside a value cannot make a line of its own (--json escapes them as JSON does).
    return "\n".join(printable(line) for line in lines)
