"""benchmarks/real_folders.py's measuring parts on small data of the test's own: the copy check, the
de-duplication of linked files, the judge's sanity cases and D's health read from a run's metrics."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def real_folders():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import real_folders

        yield real_folders
    finally:
        sys.path.remove(str(BENCHMARKS))


def blobs(n: int, seed: int) -> torch.Tensor:
    """Images from one distribution: a smooth random field per image, in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 4, 4, generator=g) * 2 - 1
    return torch.nn.functional.interpolate(coarse, size=16, mode="bilinear", align_corners=False)


def test_copy_check_counts_returned_training_images_and_not_fresh_draws(real_folders):
    train, held_out, fresh = blobs(200, 0), blobs(100, 1), blobs(400, 2)
    copied = real_folders.copy_check(train[:400], train, held_out)
    learnt = real_folders.copy_check(fresh, train, held_out)
    assert copied["copies"] == 1.0 and copied["nn_median"] == 0.0
    # Fresh draws lie as near the training set as held-out reals do: about the quantile's 10 %.
    assert 0.03 < learnt["copies"] < 0.25
    # The distances themselves, computed independently: RMS over pixels and channels.
    by_hand = min(float(((fresh[0] - t) ** 2).mean().sqrt()) for t in train)
    assert real_folders.nearest_distances(fresh[:1], train).item() == pytest.approx(by_hand, rel=1e-5)


def test_linked_and_repeated_files_count_once_and_small_classes_are_left_out(real_folders, tmp_path):
    root = tmp_path / "icons"
    for cls, colours in (("apps", [(255, 0, 0), (0, 255, 0)]), ("tiny", [(0, 0, 255)])):
        (root / cls).mkdir(parents=True)
        for index, colour in enumerate(colours):
            Image.new("RGB", (8, 8), colour).save(root / cls / f"{index}.png")
    (root / "apps" / "link.png").symlink_to(root / "apps" / "0.png")
    Image.new("RGB", (8, 8), (0, 255, 0)).save(root / "apps" / "copy.png")  # the same bytes as 1.png
    files = real_folders.distinct_files(root)
    assert sorted((path.name, cls) for path, cls in files) == [("0.png", "apps"), ("0.png", "tiny"), ("1.png", "apps")]
    assert [cls for _, cls in real_folders.distinct_files(root, min_per_class=2)] == ["apps", "apps"]


def test_flatten_square_puts_transparency_on_white_and_pads_to_a_square(real_folders, tmp_path):
    rgba = np.zeros((4, 8, 4), dtype=np.uint8)
    rgba[..., 0], rgba[..., 3] = 255, 255  # opaque red, 8 wide and 4 high
    rgba[:, :4, 3] = 0  # the left half transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = real_folders.flatten_square(tmp_path / "a.png", 8)
    assert out.shape == (8, 8, 3)
    assert (out[:2] == 255).all() and (out[6:] == 255).all()  # padding rows: white
    assert (out[2:6, :4] == 255).all()  # transparent: white
    assert (out[2:6, 4:] == [255, 0, 0]).all()  # opaque red kept


def test_d_health_reads_a_dead_and_a_separating_discriminator_from_the_last_rows(real_folders, tmp_path):
    def run(name: str, rows: list[dict]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return folder

    healthy = [{"step": i, "loss/D": 0.5, "loss/G": 1.2, "D(x)": 1.0, "D(G(z))": 0.2} for i in range(10)]
    dead = healthy[:5] + [{"step": i, "loss/D": math.log(2) + 1e-3, "loss/G": math.log(2), "D(x)": 0.31,
                           "D(G(z))": 0.3} for i in range(5, 10)]
    runaway = healthy[:5] + [{"step": i, "loss/D": 0.05, "loss/G": 3.8, "D(x)": -5.0, "D(G(z))": -9.0,
                              "health/overfit": 0.9} for i in range(5, 10)]
    assert real_folders.d_health(run("healthy", healthy))["d_verdict"] == "ok"
    assert real_folders.d_health(run("dead", dead))["d_verdict"] == "dead"
    verdict = real_folders.d_health(run("runaway", runaway))
    assert (verdict["d_verdict"], verdict["end_margin"], verdict["overfit"]) == ("separates", 4.0, 0.9)
