"""Invalid configuration is refused when the config is built, naming the field and what it accepts."""

from __future__ import annotations

import json

import pytest
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin

from gan_accel import ConfigError, GANLoss, GANTrainer, LaunchError, TrainConfig
from gan_accel.engine.launch import check_launch
from gan_accel.objectives.losses import nonsaturating_d, nonsaturating_g


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("lr_G", 0.0, "expected a finite number > 0"),
        ("lr_D", -1e-4, "expected a finite number > 0"),
        ("lr_D", float("nan"), "expected a finite number > 0"),
        ("max_steps", 0, "expected an integer >= 1"),
        ("max_steps", 2.5, "expected an integer >= 1"),
        ("batch_size", 0, "expected an integer >= 1"),
        ("batch_size", -8, "expected an integer >= 1"),
        ("sample_every", 0, "expected an integer >= 1"),
        ("log_every", 0, "expected an integer >= 1"),
        ("grad_accum_steps", 0, "expected an integer >= 1"),
        ("n_critic", 0, "expected an integer >= 1"),
        ("loss", "vanilla", "choose one of hinge, least_squares, nonsaturating, rpgan, wasserstein"),
        ("loss", 3, "pass a name"),
        ("mixed_precision", "fp8", "choose one of no, bf16, fp16"),
        ("mixed_precision", "bfloat16", "choose one of no, bf16, fp16"),
        ("lr_schedule", "cosine", "choose one of linear, constant"),
        ("warmup_ratio", 1.0, "expected a number in [0, 1)"),
        ("betas_G", (0.5, 1.5), "two numbers in [0, 1)"),
        ("clip_grad_norm_D", 0.0, "or None to disable clipping"),
        ("compile", 1, "compile=1 is invalid: expected True or False"),
        ("channels_last", "yes", "channels_last='yes' is invalid: expected True or False"),
        ("keep_freed_memory", 1, "keep_freed_memory=1 is invalid: expected True or False"),
    ],
)
def test_invalid_field_is_rejected_with_its_name_and_allowed_values(field, value, expected):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{field: value})
    message = str(info.value)
    assert message.startswith(f"{field}="), message
    assert expected in message


def test_valid_config_round_trips_through_json(tmp_path):
    config = TrainConfig(max_steps=7, loss="hinge", betas_D=(0.0, 0.9), mixed_precision="bf16", n_critic=2)
    config.to_json(tmp_path / "config.json")
    loaded = TrainConfig.from_dict(json.loads((tmp_path / "config.json").read_text()))
    assert loaded == config


def test_unknown_field_in_saved_config_is_an_error():
    with pytest.raises(ConfigError, match="unknown config field"):
        TrainConfig.from_dict({"max_step": 3})


def test_custom_loss_object_is_accepted_and_recorded_by_name():
    config = TrainConfig(loss=GANLoss("my_loss", nonsaturating_d, nonsaturating_g))
    assert config.loss_fn.name == "my_loss" and config.to_dict()["loss"] == "my_loss"


def test_several_launched_processes_without_distributed_accelerator_stop_at_once(monkeypatch):
    """What `accelerate launch --multi_gpu` gives on a GPU-less machine without ACCELERATE_USE_CPU=1."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    accelerator = Accelerator()  # env says 2 processes, but this Accelerator is not distributed
    assert accelerator.num_processes == 1
    with pytest.raises(LaunchError, match="ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu"):
        check_launch(accelerator)
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_launch(accelerator)  # a genuine single process passes


def test_user_accelerator_must_agree_with_config(tmp_path):
    from conftest import make_images, make_loader, make_models

    G, D = make_models()
    config = TrainConfig(grad_accum_steps=2, batch_size=4, output_dir=str(tmp_path))
    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    with pytest.raises(ValueError, match="sync_with_dataloader=False"):
        GANTrainer(G, D, make_loader(make_images(16), 4), config, accelerator=accelerator)


@pytest.mark.parametrize("variable, name", [("ACCELERATE_USE_DEEPSPEED", "DeepSpeed"), ("ACCELERATE_USE_FSDP", "FSDP")])
def test_deepspeed_and_fsdp_launches_are_refused_at_once_with_the_reason(monkeypatch, variable, name):
    """`accelerate config` with DeepSpeed or FSDP sets these variables for the launched processes.

    Without the check, DeepSpeed fails later inside Accelerate (it prepares one model per
    Accelerator; here it is not even installed) and FSDP on CPU silently falls back to one process.
    """
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from gan_accel.engine.launch import build_accelerator

    monkeypatch.setenv(variable, "true")
    with pytest.raises(LaunchError, match=rf"asks for {name} .*two networks with their own optimizers.*Use DDP"):
        build_accelerator(TrainConfig())
    monkeypatch.delenv(variable)
    for kind in (DistributedType.DEEPSPEED, DistributedType.FSDP):  # a user-built Accelerator is checked too
        with pytest.raises(LaunchError, match="not supported yet"):
            check_launch(SimpleNamespace(distributed_type=kind, num_processes=2))
