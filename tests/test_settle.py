"""One place settles a run (:func:`gan_accel.settle`): the command line, the example scripts and the Python API give
the same config for the same inputs, and every setting says where it came from (flag, resume, recipe, default).

Checked against independent facts: the recipe's row as :func:`gan_accel.recipes.default_recipe` gives it, the config
a finished run wrote into its folder, and TrainConfig's own field defaults."""

from __future__ import annotations

import dataclasses

import pytest

from gan_accel import DataFacts, TrainConfig, settle
from gan_accel.errors import ConfigError
from gan_accel.recipes import default_recipe

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
