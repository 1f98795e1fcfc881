"""``gan-accel train`` and what it makes of the data: names from the data escaped in every line and file, class
labels that are both names and numbers, grids of many classes, the held-out slice for D's overfitting check
(recorded, seeded, kept on resume, with its labels), and the random feature space the evaluation uses without
downloads (fixed, and telling real images from degraded ones).

The helpers and the image cache of each test's own (``own_cache``) come from tests/test_train_cli.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from gan_accel.callbacks.metrics_log import read_metrics
from test_train_cli import CLASSES, TINY, error_line, gan_accel, write_images
from test_train_cli import own_cache  # noqa: F401 (the fixture: the image cache in a folder of the test's own)


# -- the evaluation's feature space without downloads ------------------------------------------------------
def test_the_random_feature_space_is_fixed_and_tells_real_images_from_degraded_ones():
    """Two extractors built apart give the same features; in them the Frechet distance between two halves of a
    digit set is clearly smaller than to the second half blurred (a 1.5-px Gaussian), to a mode-collapsed half
    (150 digits, each twice) and to noise."""
    import torch.nn.functional as F

    from gan_accel.data import synthetic_digits
    from gan_accel.eval import frechet_distance_from_features
    from gan_accel.eval.random_features import RandomConvFeatures

    digits = synthetic_digits(600, seed=0)[0].float() / 127.5 - 1
    first, second = RandomConvFeatures(), RandomConvFeatures()
    features = first(digits)
    assert features.shape == (600, 768) and torch.equal(features, second(digits))
    assert torch.equal(features[:4], first(digits[:4].expand(-1, 3, -1, -1))), "grey is repeated to RGB"
    real, other = features[:300], digits[300:]
    taps = torch.exp(-torch.arange(-3, 4).float() ** 2 / (2 * 1.5 ** 2))
    taps = taps / taps.sum()
    blurred = F.conv2d(F.conv2d(other, taps.view(1, 1, 1, 7), padding=(0, 3)), taps.view(1, 1, 7, 1), padding=(3, 0))

    def distance(images: torch.Tensor) -> float:
        return frechet_distance_from_features(real, first(images))

    same = distance(other)
    assert distance(blurred) > 3 * same
    assert distance(torch.cat([other[:150], other[:150]])) > 1.2 * same
    assert distance(torch.rand_like(other) * 2 - 1) > distance(blurred)


# -- names and labels from the data ----------------------------------------------------------------------
def test_names_from_the_data_are_escaped_in_every_line_and_file(tmp_path, capsys):
    forged = ("a\x1b[31mred", "b\nerror: forged")
    write_images(tmp_path / "pets", 16, classes=forged)
    (tmp_path / "pets" / forged[0] / "bad\x1b[2J\tx\nerror: y.png").write_bytes(b"junk")
    out = tmp_path / "run"
    code, stdout, err = gan_accel(["train", "--data", tmp_path / "pets", "--output-dir", out, "--conditional",
                                   "--resolution", "32", "--steps", "1", *TINY], capsys)
    assert code == 0, err[-3000:]
    assert "\x1b" not in stdout + err and not any(line.startswith("error:") for line in (stdout + err).splitlines())
    assert "2 classes: a\\x1b[31mred (8), b\\nerror: forged (8)" in stdout
    assert "not an image): a\\x1b[31mred/bad\\x1b[2J\\tx\\nerror: y.png; the full list" in stdout
    listed = (out / "skipped_files.txt").read_text()
    assert listed == "a\\x1b[31mred/bad\\x1b[2J\\tx\\nerror: y.png\tnot an image\n", "one line, two columns"
    code, stdout, err = gan_accel(["sample", out, "--label", forged[1], "--num", "2", "--out", tmp_path / "s.png"],
                                  capsys)
    assert code == 0 and "class 1 ('b\\nerror: forged')" in stdout and "\nerror: forged" not in stdout, stdout
    line = error_line(["sample", out, "--label", "c", "--out", tmp_path / "t.png"], capsys)
    assert "'a\\x1b[31mred', 'b\\nerror: forged'" in line, line


class FakeG(torch.nn.Module):
    def __init__(self, names):
        super().__init__()
        self.num_classes, self.class_names = len(names), names


NUMBERED = [str(i) for i in range(1, 11)]  # folders 1..10, in label (sorted name) order: 1, 10, 2, ..., 9


@pytest.mark.parametrize("text, index, note", [
    ("1", 0, "note: --label 1 is the class named '1' (index 0), not the class at index 1 ('10'): pass index:1 "
            "for that one"),
    ("10", 1, None),  # no class has index 10: the name alone fits
    ("2", 2, None),  # the name '2' is at index 2: both readings agree, nothing to say
    ("index:0", 0, None), ("index:1", 1, None), ("name:1", 0, None), ("name:10", 1, None),
])
def test_a_label_that_is_a_name_and_a_number_is_the_name_and_says_so(text, index, note):
    from gan_accel.cli.labels import resolve_label

    assert sorted(NUMBERED) == ["1", "10", "2", "3", "4", "5", "6", "7", "8", "9"]
    said = []
    assert resolve_label(text, FakeG(sorted(NUMBERED)), log=said.append) == index
    assert said == ([note] if note else [])


@pytest.mark.parametrize("names, text, says", [
    (sorted(NUMBERED), "0", "--label '0' is no class name of this run, whose classes are named by numbers ('1', "
                            "'10', '2'"),
    (sorted(NUMBERED), "0", "pass name:NAME for a class by its name, or index:0 for the class at index 0 ('1')"),
    (sorted(NUMBERED), "11", "--label '11' is neither a class name of this run (10 classes: '1', '10'"),
    (sorted(NUMBERED), "name:0", "--label 'name:0' is not a class name of this run"),
    (sorted(NUMBERED), "index:10", "--label 'index:10': this run has 10 classes, indexed 0..9"),
    (["cats", "dogs"], "\u00b3", "--label '\u00b3' is not a class of this run (its 2 classes: 'cats', 'dogs')"),
    (["cats", "dogs"], "index:\u00b3", "is not a class index: pass a whole number 0..1 (ASCII digits)"),
    (["cats", "dogs"], "2", "--label '2' is neither a class name of this run (2 classes: 'cats', 'dogs') nor one of "
                            "its indices 0..1"),
])
def test_a_label_never_read_the_other_way_silently_is_one_line(names, text, says):
    from gan_accel.cli.common import CommandError
    from gan_accel.cli.labels import resolve_label

    with pytest.raises(CommandError) as error:
        resolve_label(text, FakeG(names), log=None)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert resolve_label("1", FakeG(["cats", "dogs"]), log=None) == 1, "plain numbers index names that are not numbers"


def test_grids_of_many_classes_wrap_into_blocks_and_keep_every_row():
    from gan_accel.pictures import to_grid

    # image k is filled with the value k / 1000 * 2 - 1: after the grid's normalisation its pixels read k / 1000
    images = (torch.arange(1000, dtype=torch.float32) / 1000 * 2 - 1).view(1000, 1, 1, 1).expand(1000, 3, 4, 4)
    grid = to_grid(images, 1)  # 1,000 classes, one sample each: a row per class
    assert grid.shape == (3, 32 * 6 + 2, 32 * 6 + 2), "32 blocks of 32 rows: about square, not a 1x1,000 strip"
    for k in (0, 31, 32, 999):  # class row k is row k % 32 of block k // 32
        top, left = 2 + (k % 32) * 6, 2 + (k // 32) * 6
        assert abs(float(grid[0, top, left]) - k / 1000) < 1e-3, k
    assert tuple(to_grid(images[:80], 8).shape) == (3, 10 * 6 + 2, 8 * 6 + 2), "a few classes: one row each, unwrapped"
    wide = to_grid(images, 8)  # 125 rows of 8
    assert max(wide.shape[1:]) < 3 * min(wide.shape[1:])


# -- the held-out slice (D's overfitting check) -----------------------------------------------------------------
def test_a_slice_of_the_images_is_held_out_of_training_recorded_and_kept_on_resume(tmp_path, capsys):
    write_images(tmp_path / "photos", 60)
    out = tmp_path / "run"
    base = ["train", "--data", tmp_path / "photos", "--output-dir", out, *TINY]
    code, stdout, err = gan_accel([*base, "--steps", "2"], capsys)
    assert code == 0, err[-3000:]
    assert "gan_accel: 3 of the 60 images held out of training for D's overfitting check" in stdout
    held = json.loads((out / "data.json").read_text())["held_out"]
    assert len(held) == 3 and len(set(held)) == 3
    row = read_metrics(out / "metrics.jsonl")[-1]
    assert {"health/d_heldout", "health/d_spread", "health/rt"} <= set(row)

    from gan_accel.data import open_image_data

    data = open_image_data(tmp_path / "photos", 32, labels="none", log=None)
    assert data.hold_out(0, batch_size=8) == 3 and [data.names[r] for r in data.held_out_rows] == held
    assert len(data.dataset()) == 57 and data.trained_on == 57
    images, labels = data.held_out()
    assert labels is None and torch.equal(images, data.real_images(len(data))[list(data.held_out_rows)])

    code, stdout, err = gan_accel([*base, "--steps", "4", "--resume", "latest"], capsys)
    assert code == 0, err[-3000:]
    assert "3 of the 60 images held out" in stdout
    assert json.loads((out / "data.json").read_text())["held_out"] == held


def test_the_held_out_slice_is_seeded_and_small_sets_hold_none_out(tmp_path):
    from gan_accel.data import open_image_data

    write_images(tmp_path / "many", 100)
    write_images(tmp_path / "few", 39)
    data = open_image_data(tmp_path / "many", 32, labels="none", log=None)
    assert data.hold_out(0) == 5
    first = data.held_out_rows
    assert data.hold_out(0) == 5 and data.held_out_rows == first  # the same choice on every process, every time
    assert data.hold_out(1) == 5 and data.held_out_rows != first
    assert data.hold_out(0, batch_size=97) == 3  # one batch stays for training
    names = [data.names[r] for r in first]
    assert data.hold_out(recorded=names) == 5 and data.held_out_rows == first  # a resumed run keeps its own
    assert data.hold_out(recorded=[]) == 0 and len(data.dataset()) == 100
    assert open_image_data(tmp_path / "few", 32, labels="none", log=None).hold_out(0) == 0


def test_a_conditional_run_probes_d_on_its_held_out_images_with_their_labels(tmp_path, capsys):
    write_images(tmp_path / "pets", 42, classes=CLASSES)
    out = tmp_path / "run"
    code, stdout, err = gan_accel(["train", "--data", tmp_path / "pets", "--output-dir", out, "--conditional",
                                   "--resolution", "32", "--steps", "2", *TINY], capsys)
    assert code == 0, err[-3000:]
    assert "3 of the 42 images held out" in stdout
    held = json.loads((out / "data.json").read_text())["held_out"]
    assert len(held) == 3 and all(name.split("/")[0] in CLASSES for name in held)
    assert "health/d_heldout" in read_metrics(out / "metrics.jsonl")[-1]


def test_eval_every_on_a_one_image_set_is_one_line_before_training(tmp_path, capsys):
    """The evaluation needs the spread of at least 2 real images: refused before any step, nothing written."""
    write_images(tmp_path / "one", 1)
    out = tmp_path / "run"
    line = error_line(["train", "--data", tmp_path / "one", "--output-dir", out, "--steps", "2", "--eval-every", "1",
                       *TINY, "--batch-size", "1"], capsys)
    assert "--eval-every" in line and "1 readable image" in line and "at least 2" in line, line
    assert not out.exists()
