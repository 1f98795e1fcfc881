"""Non-finite weights are named wherever weights are loaded: ``sample``, ``eval``, ``export``, a resume,
``load_generator`` and ``load_weights`` stop in one line naming the file and the tensor, never an all-black grid
with exit 0, never a divergence blamed on the learning rate.

Each case puts real NaN (or inf) values into one tensor of a file a tiny run wrote, then calls the entry point;
the line must name that file and that tensor, and nothing may be written. A tensor of the wrong shape is named
the same way: by its name and shapes, not by torch's header line alone.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gan_accel import load_generator
from gan_accel.errors import DivergenceError, NonFiniteWeightsError
from gan_accel.models import DCGANGenerator
from gan_accel.storage import load_weights
from gan_accel.storage.safe_tree import load_tree, save_tree
from cli_runs import CK2, CK4, Z, cli, error_line, train

STATE_0 = "gan_accel_state_0.safetensors"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 4-step run with an EMA (checkpoints at steps 2 and 4), copied by each test that breaks it."""
    out = tmp_path_factory.mktemp("nonfinite") / "run"
    train(out, steps=4)
    return out


@pytest.fixture
def run(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def poison(file, value: float = float("nan")) -> str:
    """Put ``value`` into the first floating tensor of a plain safetensors file; returns its name."""
    tensors = load_file(str(file))
    name = next(k for k, t in tensors.items() if t.is_floating_point())
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[:3] = value
    save_file(tensors, str(file), metadata={"format": "pt"})
    return name


def poison_ema(state_file) -> str:
    """Put NaN into every value of one tensor of the EMA of G kept in an engine state; returns its name."""
    state = load_tree(state_file)
    module = state["callbacks"]["generator_ema"]["module"]
    name = next(k for k, t in module.items() if t.is_floating_point())
    module[name] = torch.full_like(module[name], float("nan"))
    save_tree(state, state_file)
    return name


def says(line: str, file, tensor: str) -> None:
    assert f"{file}: " in line and f" {tensor} holds " in line and "NaN/inf" in line, line
    assert "another checkpoint or export" in line, line


def test_the_exported_generator_with_nan_is_named_by_sample_eval_export_and_load_generator(run, tmp_path, capsys):
    weights = run / "generator" / "model.safetensors"
    tensor = poison(weights)
    for argv in (["sample", run, "--out", tmp_path / "grid.png"],
                 ["eval", run, "--out", tmp_path / "scores.json"],
                 ["export", run, tmp_path / "export"]):
        says(error_line(argv, capsys), weights, tensor)
    assert not any((tmp_path / name).exists() for name in ("grid.png", "scores.json", "export"))
    with pytest.raises(NonFiniteWeightsError) as caught:
        load_generator(run)
    says(str(caught.value), weights, tensor)


def test_inf_in_a_checkpoints_raw_g_is_named(run, tmp_path, capsys):
    weights = run / "checkpoints" / CK4 / "model.safetensors"
    tensor = poison(weights, float("inf"))
    says(error_line(["sample", run / "checkpoints" / CK4, "--no-ema", "--out", tmp_path / "g.png"], capsys),
         weights, tensor)
    says(error_line(["sample", run, "--no-ema", "--out", tmp_path / "g.png"], capsys), weights, tensor)


def test_nan_in_a_checkpoints_ema_is_named(run, tmp_path, capsys):
    state = run / "checkpoints" / CK4 / STATE_0
    tensor = poison_ema(state)
    line = error_line(["sample", run / "checkpoints" / CK4, "--out", tmp_path / "g.png"], capsys)
    says(line, state, tensor)
    assert "the EMA of G" in line


@pytest.mark.parametrize("which", ["G", "D", "EMA"])
def test_resuming_broken_weights_names_them_not_the_learning_rate(run, which):
    checkpoint = run / "checkpoints" / CK4
    if which == "EMA":
        file, tensor = checkpoint / STATE_0, poison_ema(checkpoint / STATE_0)
    else:
        file = checkpoint / ("model.safetensors" if which == "G" else "model_1.safetensors")
        tensor = poison(file)
    with pytest.raises(NonFiniteWeightsError) as caught:
        train(run, steps=6, resume_from="latest")
    line = str(caught.value)
    says(line, file, tensor)
    assert "\n" not in line and CK2 in line, "the other checkpoints are named as the way on"
    assert not isinstance(caught.value, DivergenceError)


def test_load_weights_names_the_tensor(run, tmp_path):
    weights = tmp_path / "g.safetensors"
    shutil.copy(run / "generator" / "model.safetensors", weights)
    tensor = poison(weights)
    with pytest.raises(NonFiniteWeightsError) as caught:
        load_weights(DCGANGenerator(Z, 4), weights)
    says(str(caught.value), weights, tensor)


def test_finite_weights_load_and_sample_as_before(run, tmp_path, capsys):
    assert cli(["sample", run, "--num", 4, "--out", tmp_path / "ok.png"], capsys)[0] == 0
    assert load_weights(DCGANGenerator(Z, 4), run / "generator" / "model.safetensors") is not None


def test_a_tensor_of_the_wrong_shape_is_named_by_its_shapes(run, tmp_path):
    from gan_accel import CheckpointError

    checkpoint = run / "checkpoints" / CK4
    tensors = load_file(str(checkpoint / "model.safetensors"))
    name = next(k for k, t in tensors.items() if t.ndim == 4)
    tensors[name] = torch.zeros(*tensors[name].shape[:-1], tensors[name].shape[-1] + 1)
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as caught:
        train(run, steps=6, resume_from="latest")
    line = str(caught.value)
    assert "\n" not in line and f"size mismatch for {name}: copying a param with shape" in line, line
    assert str(checkpoint) in line and "another shape or width" in line
    weights = tmp_path / "g.safetensors"
    save_file({**load_file(str(run / "generator" / "model.safetensors")), name: tensors[name]}, str(weights))
    with pytest.raises(CheckpointError, match=f"size mismatch for {name}"):
        load_weights(DCGANGenerator(Z, 4), weights)


def test_a_cached_judge_with_nan_weights_is_named(tmp_path):
    """The MNIST classifier that scores ``gan-accel eval`` is weights too: NaN there would score any G as nonsense.
    (``eval`` reads its judge through this function: test_safe_loading's poisoned-judge case goes that way.)"""
    from gan_accel.eval.mnist import ClassifierCacheError, MnistClassifier, load_or_train_classifier

    judge = tmp_path / "offline-digits_classifier.safetensors"
    state = {k: v.clone() for k, v in MnistClassifier().state_dict().items()}
    name = next(k for k, t in state.items() if t.is_floating_point())
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(judge))
    with pytest.raises(ClassifierCacheError) as caught:
        load_or_train_classifier(judge, torch.zeros(1, 1, 28, 28), torch.zeros(1, dtype=torch.long))
    line = str(caught.value)
    assert f"{judge}: tensor {name} holds 1 NaN/inf value(s)" in line and "delete the file to retrain it" in line, line
