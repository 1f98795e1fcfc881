"""The training plot: drawn from metrics rows with Pillow, written into the run folder at every sample
interval and at the end, recorded as the run's; ``plot_run`` reads a run folder's log."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageChops

from conftest import Z_DIM, make_images, make_loader, make_models
from gan_accel import Callback, GANTrainer, TrainConfig
from gan_accel.errors import GanAccelError, RunFolderError
from gan_accel.pictures.training_plot import COLUMNS, PANEL_SIZE, PANELS, plot_metrics, plot_run, plot_size
from gan_accel.storage.layout import RUN_FILES


def rows_of(steps=20, loss_g=lambda i: 0.8 + 0.05 * i, lr=2e-4):
    return [{"step": 5 * i, "loss/D": 1.3 - 0.01 * i, "loss/G": loss_g(i), "D(x)": 0.1 * i, "D(G(z))": -0.1 * i,
             "grad_norm/D": 1.0 + (i % 3), "grad_norm/G": 2.0, "lr/D": lr, "lr/G": lr, "images/s": 100.0 + i,
             **({"health/diversity": 3.0 - 0.1 * i} if i % 4 == 0 else {})} for i in range(1, steps + 1)]


def panel(image: Image.Image, title: str) -> Image.Image:
    index = [name for name, _ in PANELS].index(title)
    left, top = (index % COLUMNS) * PANEL_SIZE[0], (index // COLUMNS) * PANEL_SIZE[1]
    return image.crop((left, top, left + PANEL_SIZE[0], top + PANEL_SIZE[1]))


def differs(a: Image.Image, b: Image.Image) -> bool:
    return ImageChops.difference(a.convert("RGB"), b.convert("RGB")).getbbox() is not None


def test_the_plot_responds_to_its_data_panel_by_panel(tmp_path):
    base = Image.open(plot_metrics(rows_of(), tmp_path / "base.png"))
    same = Image.open(plot_metrics(rows_of(), tmp_path / "same.png"))
    other_g = Image.open(plot_metrics(rows_of(loss_g=lambda i: 0.8 + 0.2 * math.sin(i)), tmp_path / "g.png"))
    other_lr = Image.open(plot_metrics(rows_of(lr=1e-3), tmp_path / "lr.png"))
    assert base.size == plot_size() == (PANEL_SIZE[0] * COLUMNS, PANEL_SIZE[1] * 3)
    assert not differs(base, same)  # deterministic
    assert differs(panel(base, "losses"), panel(other_g, "losses"))
    assert not differs(panel(base, "learning rates"), panel(other_g, "learning rates"))
    assert differs(panel(base, "learning rates"), panel(other_lr, "learning rates"))
    assert not differs(panel(base, "losses"), panel(other_lr, "losses"))
    # Every panel of this log has data: none shows the "no data" placeholder, which an empty log does.
    empty = Image.open(plot_metrics([], tmp_path / "empty.png"))
    for name, _ in PANELS:
        assert differs(panel(base, name), panel(empty, name)), name


def test_non_finite_values_missing_keys_and_a_single_row_do_not_break_the_plot(tmp_path):
    rows = rows_of(6)
    rows[2]["loss/G"] = math.nan
    rows[3]["loss/G"] = math.inf
    rows[4]["grad_norm/D"] = -math.inf
    rows[5].pop("D(x)")
    rows[1]["note"] = "text"  # not a number: ignored
    marked = Image.open(plot_metrics(rows, tmp_path / "bad.png"))
    clean = Image.open(plot_metrics(rows_of(6), tmp_path / "clean.png"))
    assert marked.size == plot_size()
    # The non-finite points are marked in red on the losses panel; a clean log has no red there.
    def red(image):
        pixels = np.asarray(panel(image, "losses").convert("RGB")).astype(int)
        return int(((pixels[..., 0] > 200) & (pixels[..., 1] < 40) & (pixels[..., 2] < 40)).sum())

    assert red(marked) > 0 and red(clean) == 0
    for only in ([{"step": 3, "loss/D": 1.0}], [{"step": 3, "loss/D": math.nan}], [{"step": 0, "lr/G": 0.0}]):
        assert Image.open(plot_metrics(only, tmp_path / "one.png")).size == plot_size()


def test_plot_run_reads_the_log_and_says_what_to_do_without_one(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(RunFolderError, match="metrics.jsonl does not exist: plot a run folder"):
        plot_run(run_dir)
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    with pytest.raises(GanAccelError, match="has no metrics rows yet"):
        plot_run(run_dir)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows_of()))
    assert plot_run(run_dir) == run_dir / "training_plot.png"
    assert Image.open(run_dir / "training_plot.png").size == plot_size()
    assert plot_run(run_dir, out=tmp_path / "elsewhere.png") == tmp_path / "elsewhere.png"
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss/D": 1.0}\n{"step": 2, "lo')  # a row a crash cut short
    plot_run(run_dir, out=tmp_path / "torn.png")  # is skipped: the picture of the whole rows
    plot_metrics([{"step": 1, "loss/D": 1.0}], tmp_path / "whole.png")
    assert (tmp_path / "torn.png").read_bytes() == (tmp_path / "whole.png").read_bytes()


class PlotWatcher(Callback):
    """After the built-in plot: the plot's digest at every sample interval."""

    def __init__(self):
        self.seen = []

    def on_sample(self, trainer):
        path = trainer.output_dir / "training_plot.png"
        self.seen.append((trainer.step, hashlib.sha256(path.read_bytes()).hexdigest()))


def test_a_run_redraws_its_plot_at_every_sample_interval_and_records_it(tmp_path):
    watcher = PlotWatcher()
    G, D = make_models(dtype=torch.float32)
    config = TrainConfig(max_steps=12, batch_size=8, z_dim=Z_DIM, log_every=2, sample_every=4, num_samples=8,
                         output_dir=str(tmp_path / "run"), progress_bar=False)
    GANTrainer(G, D, make_loader(make_images(128, dtype=torch.float32), 8), config, callbacks=[watcher]).fit()
    assert [step for step, _ in watcher.seen] == [4, 8, 12]
    assert len({digest for _, digest in watcher.seen}) == 3  # new rows, new picture
    plot = tmp_path / "run" / "training_plot.png"
    assert Image.open(plot).size == plot_size(len(PANELS) + 1)  # and D's probe
    assert "training_plot.png" in RUN_FILES  # a name of the run's own: gan-accel --out refuses it in a run folder


def test_ds_probe_has_a_panel_and_its_spread_joins_ds_outputs(tmp_path):
    def probed(overfit):
        return [{**row, "health/d_spread": 0.5, "health/rt": 0.8, "health/overfit": overfit(i)}
                for i, row in enumerate(rows_of(8))]

    base = Image.open(plot_metrics(probed(lambda i: 0.1), tmp_path / "base.png"))
    other = Image.open(plot_metrics(probed(lambda i: 0.1 * i), tmp_path / "other.png"))
    assert base.size == plot_size(len(PANELS) + 1) == (PANEL_SIZE[0] * COLUMNS, PANEL_SIZE[1] * 4)

    def probe_panel(image):
        index = len(PANELS)
        left, top = (index % COLUMNS) * PANEL_SIZE[0], (index // COLUMNS) * PANEL_SIZE[1]
        return image.crop((left, top, left + PANEL_SIZE[0], top + PANEL_SIZE[1]))

    assert differs(probe_panel(base), probe_panel(other))
    outputs = "discriminator outputs (mean logits; d_spread: their spread on D's probe)"
    assert not differs(panel(base, outputs), panel(other, outputs))
    unprobed = Image.open(plot_metrics(rows_of(8), tmp_path / "plain.png"))
    assert differs(panel(base, outputs), panel(unprobed, outputs))  # the spread is drawn with D's outputs
