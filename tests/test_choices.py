"""The help texts and the docs' lists of losses, model families, sizes and latent sizes come from the registries
(:mod:`gan_accel.cli.choices`): a loss or family added to the code and missing from docs/config.md, docs/cli.md or
``--help`` fails here."""

from __future__ import annotations

import re
from pathlib import Path

from gan_accel.cli import build_parser
from gan_accel.cli.choices import families_table, family_sizes, loss_names, recipe_families, z_defaults
from gan_accel.models import FAMILIES
from gan_accel.objectives import LOSSES
from gan_accel.recipes import family_for

DOCS = Path(__file__).resolve().parents[1] / "docs"


def train_help() -> str:
    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions).choices["train"]
    return " ".join(train.format_help().split())  # argparse wraps lines: compare the words


def test_the_lists_name_every_entry_of_the_registries():
    assert all(name in loss_names() for name in LOSSES) and "rpgan (relativistic pairing)" in loss_names()
    assert z_defaults() == "dcgan 100, resnet 128, r3gan 64"  # r3gan's own latent size, not resnet's
    for name, family in FAMILIES.items():
        assert f"{name} {family.default_z_dim}" in z_defaults() and f"`{name}`" in families_table()
        assert str(family.resolutions[-1]) in family_sizes()
    assert "256 px" in family_sizes()
    # the recipe's families, size by size, as family_for picks them
    assert recipe_families(gpu=True) == "dcgan at 28 to 32 px, r3gan at 64 to 256 px"
    assert [family_for(side, gpu=False) for side in (28, 64, 128)] == ["dcgan", "dcgan", "resnet"]


def test_the_train_help_is_written_from_the_registries():
    text = train_help()
    for line in (loss_names(), family_sizes(), z_defaults(), recipe_families(gpu=False), recipe_families(gpu=True)):
        assert " ".join(line.split()) in text, line
    assert "unless --model resnet" not in text  # the old hand-kept text, which forgot r3gan's sizes


def test_docs_config_lists_every_loss():
    row = next(line for line in (DOCS / "config.md").read_text().splitlines() if line.startswith("| `loss` |"))
    listed = re.findall(r'`"(\w+)"`', row.split("|")[3])
    assert listed == list(LOSSES), f"docs/config.md's loss row lists {listed}, the registry {list(LOSSES)}"


def test_docs_cli_lists_the_losses_and_families_as_the_code_has_them():
    text = (DOCS / "cli.md").read_text()
    assert families_table() in text, "docs/cli.md's table of model families differs from choices.families_table()"
    assert f"`--loss` takes {loss_names()}." in text
