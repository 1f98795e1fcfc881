"""The recipe table: what `gan-accel train` takes for the settings left out, by resolution and data size."""

from __future__ import annotations

import json
import math

import pytest

from gan_accel import DataFacts, Ramp, settle
from gan_accel.errors import ConfigError
from gan_accel.recipes import FEW_IMAGES, default_recipe, family_for, penalty_gamma
from test_train_cli import TINY, gan_accel, write_images


def test_the_rows_by_side_and_device():
    small = default_recipe(32, 10_000)
    assert (small.model, small.width, small.loss, small.r1_gamma, small.r2_gamma) == ("dcgan", 32, "rpgan", 0.1, 0.1)
    assert default_recipe(28, 10_000) == small
    assert [family_for(side, gpu=False) for side in (28, 32, 64, 128, 256)] == ["dcgan"] * 3 + ["resnet"] * 2
    assert [family_for(side, gpu=True) for side in (28, 32, 64, 128, 256)] == ["dcgan"] * 2 + ["r3gan"] * 3
    big = default_recipe(64, 10_000, gpu=True)
    assert (big.model, big.loss, big.r1_every, big.beta1) == ("r3gan", "rpgan", 1, 0.0)
    assert default_recipe(64, 10_000, gpu=False).ramp_to == {}  # a CPU row keeps the measured constants
    # On a CPU the 64-px dcgan keeps width 32 (6,000 steps in minutes, not hours); resnet above keeps its own.
    assert [default_recipe(side, 10_000).width for side in (64, 128)] == [32, None]
    # The CPU rows' gamma: the 32-px row's 0.1 up to 32 px; from 64 px R3GAN's 64-px value (measured on icons).
    assert [default_recipe(side, 531).r1_gamma for side in (28, 32, 64, 128, 256)] == [0.1, 0.1, 2.0, 2.0, 2.0]
    assert all(default_recipe(side, 531).r2_gamma == default_recipe(side, 531).r1_gamma for side in (32, 64, 256))


def test_gamma_goes_through_the_published_values_and_grows_with_the_side():
    assert penalty_gamma(64) == 2.0 and penalty_gamma(256) == 150.0  # R3GAN's FFHQ-64 and FFHQ-256
    assert penalty_gamma(128) == pytest.approx(math.sqrt(2.0 * 150.0), abs=0.01)  # the power law's midpoint
    assert penalty_gamma(28) == penalty_gamma(32) == 0.1
    sides = [28, 32, 64, 128, 256]
    assert all(penalty_gamma(a) <= penalty_gamma(b) for a, b in zip(sides, sides[1:]))


def test_augmentation_is_on_for_small_sets_only():
    assert default_recipe(32, FEW_IMAGES).augment == "ada"
    assert default_recipe(32, FEW_IMAGES + 1).augment == "none"
    with pytest.raises(ConfigError, match="positive side and image count"):
        default_recipe(32, 0)



def test_a_conditional_run_with_few_images_a_class_takes_diffaugment():
    """The rule is per class: a conditional D judges each class on that class's images alone."""
    for images, classes in ((531, 9), (FEW_IMAGES * 3, 3), (40, 4)):  # 59, 200 and 10 a class
        assert default_recipe(32, images, classes=classes).augment == "diffaugment", (images, classes)
    assert default_recipe(32, FEW_IMAGES * 3 + 3, classes=3).augment == "none"  # 201 a class
    assert default_recipe(28, 60_000, classes=10).augment == "none"  # MNIST's 6,000 a class
    assert default_recipe(32, 531).augment == "none"  # the same icons unconditional: the unconditional rule
    run = settle({"steps": 10}, DataFacts(32, 531, classes=9))
    assert run.config.augment == "diffaugment" and run.sources["augment"] == "recipe"
    assert "augment diffaugment" in " ".join(run.notes)
    assert settle({"steps": 10, "augment": "none"}, DataFacts(32, 531, classes=9)).config.augment == "none"


def test_the_published_row_ramps_over_the_runs_images_and_leaves_given_flags_alone():
    recipe = default_recipe(256, 5_000, gpu=True)
    ramps = recipe.ramps(1_000_000, given=set())
    assert ramps["lr_G"] == Ramp(2e-4, 5e-5, 1_000_000) == ramps["lr_D"]
    assert ramps["r1_gamma"] == Ramp(150.0, 15.0, 1_000_000) == ramps["r2_gamma"]
    assert ramps["beta2"] == Ramp(0.9, 0.99, 1_000_000) and ramps["augment_p"] == Ramp(0.0, 0.3, 1_000_000)
    assert set(recipe.ramps(1_000_000, given={"lr_g", "beta2"})) == {"lr_D", "r1_gamma", "r2_gamma", "augment_p"}
    given = {"steps": 10, "batch_size": 8, "grad_accum": 2, "width": 4, "lr_g": 2e-4}
    config = settle(given, DataFacts(256, 5_000), gpu=True, processes=2).config
    images = 10 * 8 * 2 * 2  # steps x batch x accumulation x processes
    assert config.lr_G == 2e-4 and config.lr_D == Ramp(2e-4, 5e-5, images)  # --lr-g given: constant
    assert config.betas_G == (0.0, Ramp(0.9, 0.99, images)) and config.augment_p == Ramp(0.0, 0.3, images)
    assert config.r1_gamma == Ramp(150.0, 15.0, images)
    # a conditional run has no penalties: the gamma ramps stay off
    config = settle(given, DataFacts(256, 5_000, classes=3), gpu=True, processes=2).config
    assert config.r1_gamma is None and config.r2_gamma is None


def test_left_out_settings_come_from_the_recipe_and_given_flags_win(tmp_path, capsys):
    write_images(tmp_path / "pics", 12, size=(32, 32))
    tiny = [a for a in TINY if a not in ("--width", "4")]
    code, out, err = gan_accel(["train", "--data", tmp_path / "pics", "--output-dir", tmp_path / "a", "--steps", "1",
                                *tiny], capsys)
    assert code == 0, err[-3000:]
    assert "the recipe for dcgan at this size and data: dcgan width 32, rpgan loss" in out
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["loss"], config["r1_gamma"], config["r2_gamma"], config["lr_G"]) == ("rpgan", 0.1, 0.1, 3e-3)
    assert config["model"]["width"] == 32 and config["augment"] == "ada"  # 12 images: a few-shot set
    code, out, err = gan_accel(["train", "--data", tmp_path / "pics", "--output-dir", tmp_path / "b", "--steps", "1",
                                "--loss", "hinge", "--lr-g", "5e-4", "--augment", "none", "--width", "8",
                                *tiny], capsys)
    assert code == 0, err[-3000:]
    # the line says what the run uses: the flags given, marked, not the recipe's values they replace
    assert "dcgan width 8 (flag), hinge loss (flag) with R1 gamma 0.1, lr G 0.0005 (flag), lr D 0.003, " \
           "betas (0.5, 0.99), augment none (flag) (measured on 2 CPU cores); (flag): a flag given" in out
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert (config["loss"], config["lr_G"], config["lr_D"], config["augment"]) == ("hinge", 5e-4, 3e-3, "none")
    assert config["r2_gamma"] is None and config["model"]["width"] == 8  # R2 partners only the relativistic loss
