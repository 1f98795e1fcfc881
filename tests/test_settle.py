"""One place settles a run (:func:`gan_accel.settle`): the command line, the example scripts and the Python API give
the same config for the same inputs, and every setting says where it came from (flag, resume, recipe, default).

Checked against independent facts: the recipe's row as :func:`gan_accel.recipes.default_recipe` gives it, the config
a finished run wrote into its folder, and TrainConfig's own field defaults."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gan_accel import DataFacts, TrainConfig, settle
from gan_accel.cli import build_parser
from gan_accel.errors import ConfigError
from gan_accel.recipes import default_recipe
from gan_accel.settle import COMMAND_DEFAULTS, DEFAULTS, check_given, settings_of
from test_train_cli import gan_accel
from test_user_errors import load_example

DOCS = Path(__file__).resolve().parents[1] / "docs"
SMALL = {"steps": 1, "batch_size": 8, "sample_every": 1, "log_every": 1, "checkpoint_every": 1, "no_progress": True}


def flags(settings: dict) -> list[str]:
    """The command line of ``settings``."""
    line = []
    for name, value in settings.items():
        line += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return line


def written_config(folder: Path) -> TrainConfig:
    """The config a run wrote into its folder, without the notes each caller adds about its data."""
    return TrainConfig.from_dict({**json.loads((folder / "config.json").read_text()), "extra": {}})


def test_the_command_line_the_example_and_the_api_settle_the_same_run(tmp_path, capsys):
    # 210 grey 28-px images: the recipe's row for MNIST's size (more than a few-shot set, as MNIST's 60,000 are)
    rng = np.random.default_rng(0)
    (tmp_path / "digits").mkdir()
    for index in range(210):
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(tmp_path / "digits" / f"{index}.png")
    # d_position given: the example's own default D reads where MNIST's digits sit (its SCRIPT_DEFAULTS)
    given = {**SMALL, "output_dir": str(tmp_path / "run"), "lr_g": 1e-3, "seed": 3, "d_position": "none"}
    code, out, err = gan_accel(["train", "--data", tmp_path / "digits", *flags(given)], capsys)
    assert code == 0, err[-3000:]
    command_line = written_config(tmp_path / "run")

    example = load_example("dcgan_mnist")
    args = example.parse_args(flags(given))
    from gan_accel.cli.train_flags import given_settings

    assert given_settings(args) == given  # the example reads only what was typed
    by_example = example.settle_mnist(given_settings(args), conditional=False).config
    by_api = settle(given, DataFacts(side=28, count=60_000, channels=1)).config
    for config in (by_example, by_api):
        assert dataclasses.replace(config, extra={}) == command_line
    row = default_recipe(28, 60_000)  # independently: the row's values, the flag given instead of its lr G
    assert (by_api.loss, by_api.lr_G, by_api.lr_D, by_api.r1_gamma, by_api.betas_G) == \
        (row.loss, 1e-3, row.lr, row.r1_gamma, (row.beta1, row.beta2))
    assert "lr G 0.001 (flag), lr D 0.003" in out  # the recipe line says what the run uses


def test_a_flag_beats_the_recipe_and_r2_partners_only_the_relativistic_loss():
    data = DataFacts(side=32, count=5_000)
    run = settle({"loss": "hinge", "width": 8}, data)
    assert (run.config.loss, run.sources["loss"], run.config.r2_gamma) == ("hinge", "flag", None)
    assert run.sources["r1_gamma"] == "recipe" and run.config.r1_gamma == default_recipe(32, 5_000).r1_gamma
    assert run.spec["width"] == 8 and run.sources["width"] == "flag"
    assert "dcgan width 8 (flag), hinge loss (flag) with R1 gamma 0.1" in run.notes[0]
    rpgan = settle({"loss": "rpgan"}, data)
    assert rpgan.config.r2_gamma == 0.1 and rpgan.sources["r2_gamma"] == "recipe"
    # the caller's own defaults win over the row, a flag over both
    scripted = settle({"lr_d": 5e-4}, data, defaults={"lr_g": 1e-3, "lr_d": 2e-3})
    assert (scripted.config.lr_G, scripted.sources["lr_g"]) == (1e-3, "default")
    assert (scripted.config.lr_D, scripted.sources["lr_d"]) == (5e-4, "flag")
    assert "lr G 0.001 (default), lr D 0.0005 (flag)" in scripted.notes[0]
    # without the recipe: the table's defaults, no line to print
    plain = settle({}, data, recipe=False)
    assert plain.notes == [] and plain.config.lr_G == TrainConfig().lr_G and plain.sources["lr_g"] == "default"


def test_a_resume_keeps_the_recorded_settings_and_a_flag_still_wins():
    data = DataFacts(side=32, count=5_000)
    first = settle({"loss": "hinge", "lr_g": 5e-4, "batch_size": 8, "seed": 3, "steps": 40}, data)
    again = settle({}, data, recorded=first.config.to_dict())
    assert again.config == first.config and again.notes == []  # nothing comes from the recipe
    assert {again.sources[name] for name in ("loss", "lr_g", "lr_d", "batch_size", "seed", "steps", "model")} == \
        {"resume"}
    longer = settle({"steps": 80}, data, recorded=first.config)
    assert longer.config == dataclasses.replace(first.config, max_steps=80) and longer.sources["steps"] == "flag"


def test_a_resume_on_the_command_line_keeps_the_flags_the_run_started_with(tmp_path, capsys):
    from test_train_cli import write_images

    write_images(tmp_path / "pics", 12, size=(32, 32))
    base = ["train", "--data", tmp_path / "pics", "--output-dir", tmp_path / "run", "--width", "4",
            *flags({**SMALL, "checkpoint_every": 2})]
    code, _, err = gan_accel([*base, "--loss", "hinge", "--seed", "3", "--steps", "2"], capsys)
    assert code == 0, err[-3000:]
    # the same command without --loss and --seed: the run's own, not the recipe's rpgan (which a resume refuses)
    code, out, err = gan_accel([*base, "--steps", "4", "--resume", "latest"], capsys)
    assert code == 0, err[-3000:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["loss"], config["seed"], config["max_steps"]) == ("hinge", 3, 4)
    assert "the recipe for" not in out  # every setting is the run's or a flag
    # a fork (the checkpoint into a new folder) keeps them too: a new run, but the checkpoint's settings
    checkpoint = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    fork = [*base[:3], "--output-dir", tmp_path / "fork", *base[5:], "--steps", "6", "--resume", checkpoint]
    code, out, err = gan_accel(fork, capsys)
    assert code == 0, err[-3000:]
    config = json.loads((tmp_path / "fork" / "config.json").read_text())
    assert (config["loss"], config["seed"], config["max_steps"]) == ("hinge", 3, 6)
    assert "the recipe for" not in out


def test_a_conditional_run_has_no_penalties_and_its_own_defaults():
    run = settle({}, DataFacts(side=32, count=5_000, classes=3))
    assert run.config.r1_gamma is None and run.config.r2_gamma is None and run.sources["r1_gamma"] == "recipe"
    assert "no R1/R2" in run.notes[0] and "(conditional: the class loss regularises D, not R1/R2)" in run.notes[0]
    assert (run.config.label_distribution, run.config.class_loss_weight) == ("data", 1.0)
    assert run.config.num_samples == 3 * 8 and run.spec["d_position"] == "coords"  # a row of 8 per class
    unconditional = settle({}, DataFacts(side=32, count=5_000))
    assert unconditional.settings["class_weight"] is None and unconditional.config.class_loss_weight == 0.0
    with pytest.raises(ConfigError, match="--class-weight is a setting of a class-conditional run"):
        settle({"class_weight": 1.0}, DataFacts(side=32, count=5_000))
    with pytest.raises(ConfigError, match="unknown setting"):
        settle({"lr": 1e-3}, DataFacts(side=32, count=5_000))


def test_one_default_per_setting_the_flags_read_it_and_the_docs_say_why_the_command_line_differs():
    config_defaults = settings_of(TrainConfig())
    differ = {name for name in DEFAULTS if DEFAULTS[name] != config_defaults[name]}
    assert differ == set(COMMAND_DEFAULTS)  # every other default is TrainConfig's own
    table = (DOCS / "config.md").read_text().split("## The command line's defaults")[1]
    fields = {"lr_g": "lr_G", "class_weight": "class_loss_weight"}
    for name in differ:
        row = next((line for line in table.splitlines() if f"`{fields.get(name, name)}`" in line), None)
        assert row is not None and row.rstrip().endswith(". |"), f"docs/config.md: say why {name} differs"
    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions).choices["train"]
    defaults = {action.dest: action.default for action in train._actions if action.dest in DEFAULTS}
    # the flags the recipe or the data fill in have none of their own; every other flag's default is the table's
    filled = {"model", "width", "z_dim", "loss", "lr_g", "lr_d", "beta1", "beta2", "r1_every", "r1_gamma", "r2_gamma",
              "ema_decay", "augment", "augment_p", "label_distribution", "class_weight", "d_position", "steps",
              "output_dir"}
    mismatched = {name: value for name, value in defaults.items() if name not in filled and value != DEFAULTS[name]}
    assert mismatched == {}
    assert re.search(r"\| `batch_size` \| 128 \| 64 \|", table)


def test_a_conditional_run_refuses_the_profiles_read_before_the_data():
    with pytest.raises(ConfigError, match="--d-position profiles is a read of an unconditional D"):
        check_given({"d_position": "profiles"}, conditional=True)
    check_given({"d_position": "profiles"}, conditional=False)  # an unconditional D takes it
