"""``gan-accel train ... --dry-run``: the settled run printed (the data, the model and its parameters, every setting
with where it came from, the expected time), exit 0, and nothing written: no run folder, no image cache.

Checked against independent facts: the parameter counts against the networks the registry builds, the sources
against the flags the test typed, the filesystem against a snapshot taken before."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gan_accel.cli import build_parser
from gan_accel.models import build_models, default_spec
from test_train_cli import TINY, gan_accel, write_images


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """The image cache in the test's own folder (the project's $GAN_ACCEL_CACHE), no network."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def settings(out: str) -> dict[str, tuple[str, str]]:
    """The dry run's settings table: flag -> (value, source)."""
    rows = re.findall(r"^  (--[\w-]+) +(.+?) +(flag|recipe|resume|data|default)$", out, re.MULTILINE)
    return {flag: (value, source) for flag, value, source in rows}


def test_a_dry_run_prints_the_settled_run_and_writes_nothing(tmp_path, cache, capsys):
    write_images(tmp_path / "pics", 12, size=(40, 36))
    before = files_under(tmp_path)
    out_dir = tmp_path / "run"
    code, out, err = gan_accel(["train", "--data", tmp_path / "pics", "--output-dir", out_dir, "--dry-run",
                                "--augment", "diffaugment", "--batch-size", "8", "--seed", "0", "--steps", "3"], capsys)
    assert code == 0, err[-3000:]
    assert files_under(tmp_path) == before and not out_dir.exists() and not cache.exists()  # nothing written
    assert "dry run" in out and "nothing is written" in out
    assert "data: 12 images in" in out and "-> 32 px, 3 channel(s)" in out
    table = settings(out)
    assert table["--augment"] == ("diffaugment", "flag") and table["--batch-size"] == ("8", "flag")
    assert table["--seed"] == ("0", "flag")  # typed, though it is the default's value
    assert table["--steps"] == ("3", "flag")
    assert table["--loss"] == ("rpgan", "recipe") and table["--lr-g"] == ("0.003", "recipe")
    assert table["--width"] == ("32", "recipe") and table["--model"] == ("dcgan", "recipe")
    assert table["--resolution"] == ("32", "data") and table["--channels"] == ("3", "data")
    assert table["--grad-accum"] == ("1", "default") and table["--output-dir"] == (str(out_dir), "flag")
    G, D = build_models(default_spec("dcgan", 32, 3, width=32))
    counts = [sum(p.numel() for p in net.parameters()) for net in (G, D)]
    assert f"G {counts[0]:,} parameters, D {counts[1]:,}" in out
    assert re.search(r"expected time: about .+ \(3 steps at .+ each, timed just now", out)
    # the recipe line says what the run uses: the augmentation given, not the recipe's
    assert "augment diffaugment (flag)" in out


def test_a_dry_run_reads_a_cached_scan_and_a_resume_takes_the_runs_settings(tmp_path, cache, capsys):
    write_images(tmp_path / "pics", 12, size=(32, 32), grey=True)
    run = tmp_path / "run"
    code, _, err = gan_accel(["train", "--data", tmp_path / "pics", "--output-dir", run, "--steps", "2",
                              "--resolution", "28", *TINY], capsys)
    assert code == 0, err[-3000:]
    before = files_under(tmp_path)
    code, out, err = gan_accel(["train", "--data", tmp_path / "pics", "--output-dir", run, "--resume", "latest",
                                "--dry-run", "--batch-size", "8", "--steps", "4"], capsys)
    assert code == 0, err[-3000:]
    assert files_under(tmp_path) == before  # the run folder, its lock and the cache as they were
    table = settings(out)
    assert table["--resolution"] == ("28", "resume") and table["--channels"] == ("1", "resume")
    assert table["--model"] == ("dcgan", "resume") and table["--resume"] == ("latest", "flag")
    assert "expected time: not timed" in out


def test_the_flags_given_are_recorded_by_their_own_name_an_alias_or_underscores():
    args = build_parser().parse_args(["train", "--data", "x", "--output_dir", "o", "--kimg", "2", "--lr-g", "1e-3",
                                      "--no-channels-last"])
    assert {"output_dir", "images", "lr_g", "channels_last", "data"} == set(args.flags_given)


def test_a_conditional_dry_run_names_its_classes_and_auto_on_an_empty_folder_is_timed_as_a_new_run(tmp_path, cache,
                                                                                                    capsys):
    write_images(tmp_path / "pets", 24, size=(32, 32), classes=("cats", "dogs"))
    before = files_under(tmp_path)
    code, out, err = gan_accel(["train", "--data", tmp_path / "pets", "--conditional", "--dry-run", "--batch-size", "8",
                                "--epochs", "2", "--resume", "auto", "--output-dir", tmp_path / "run"], capsys)
    assert code == 0, err[-3000:]
    assert files_under(tmp_path) == before and not cache.exists()
    assert "2 classes: cats (12), dogs (12)" in out
    table = settings(out)
    assert table["--steps"] == ("6", "flag")  # 2 epochs of 24 // 8 batches (fewer than 40 images: none held out)
    assert table["--label-distribution"] == ("data", "default") and table["--d-position"] == ("coords", "default")
    assert table["--r1-gamma"] == ("0", "recipe")  # a conditional run's class loss regularises D
    assert re.search(r"expected time: about .+ \(6 steps at", out)


def test_the_example_scripts_dry_run_downloads_and_writes_nothing(tmp_path, cache, capsys, monkeypatch):
    from conftest import reset_accelerate_state
    from test_user_errors import load_example

    monkeypatch.chdir(tmp_path)
    example = load_example("conditional_mnist")
    reset_accelerate_state()
    try:  # no MNIST in an empty --data-dir: "auto" takes the offline digits, as --dataset digits would
        code = example.main(["--dry-run", "--data-dir", str(tmp_path / "data"), "--steps", "20", "--seed", "0"])
    finally:
        reset_accelerate_state()
    out = capsys.readouterr().out
    assert code == 0 and not any(tmp_path.iterdir()) and not cache.exists()  # no download, no run folder
    table = settings(out)
    assert table["--steps"] == ("20", "flag") and table["--seed"] == ("0", "flag")
    assert table["--class-weight"] == ("1", "default") and table["--output-dir"] == ("runs/conditional_mnist", "default")
    assert "--conditional" not in table  # the script's choice, not a flag
    G, D = build_models(default_spec("dcgan", 28, 1, 10, width=32))
    assert f"G {sum(p.numel() for p in G.parameters()):,} parameters, D {sum(p.numel() for p in D.parameters()):,}" in out
    assert re.search(r"expected time: about .+ \(20 steps at", out)
