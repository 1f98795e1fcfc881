"""``gan-accel plot RUN [--out PATH]``: the run's metrics log drawn as one PNG.

By default the picture is the run's own ``<run>/training_plot.png`` (the one its ``training_plot`` callback
draws), drawn again from the whole log. ``--out`` names a new file instead; an existing one is never
replaced. Works while the run trains: it only reads ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from ..pictures.training_plot import plot_run
from ..storage.files import atomic_path
from ..storage.reading import MAX_IMAGE_BYTES, read_bytes
from ..storage.layout import METRICS, TRAINING_PLOT, read_metrics_tolerant, skipped_rows_note
from .common import CommandError, check_new_output, resolve_run, write_new_file


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "plot", help="draw a run's metrics log (losses, D outputs, rates, evaluation scores) as a PNG",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN", help="a run folder (the --output-dir of a training run)")
    parser.add_argument("--out", default=None, help="a new .png file (default: the run's own "
                        "<RUN>/training_plot.png, redrawn)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    run_dir = resolve_run(args.run_dir, "plot")
    out = Path(args.out) if args.out else None
    if out is not None:
        if out.suffix.lower() != ".png":
            raise CommandError(f"--out {out}: the plot is a PNG; give a path ending in .png")
        check_new_output(out)
    # Drawn aside first (a run without metrics rows is refused here), then put in place: the run's own
    # plot is replaced atomically, an --out is linked in (one that appeared meanwhile is not replaced).
    with tempfile.TemporaryDirectory() as scratch:
        drawn = read_bytes(plot_run(run_dir, out=Path(scratch) / "plot.png"), MAX_IMAGE_BYTES)
    if out is None:
        path = run_dir / TRAINING_PLOT
        with atomic_path(path) as tmp:
            tmp.write_bytes(drawn)
    else:
        write_new_file(out, drawn)
        path = out
    print(f"wrote {path}")
    rows, skipped = read_metrics_tolerant(run_dir / METRICS)
    note = skipped_rows_note(len(rows), skipped)
    if note:
        print(f"note: {note}")
    return 0
