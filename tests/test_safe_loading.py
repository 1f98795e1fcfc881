"""Nothing gan_accel reads runs code (docs/security.md).

A payload whose ``__reduce__`` creates a marker folder is planted in every file a run folder, a
checkpoint or a cache holds, and each entry point that reads it is called: the marker never appears,
and the user gets one line naming the file (exit 2 from the command line, an ``UnsafeFileError`` /
``GanAccelError`` from the API). The payload itself is shown to work when unpickled the unsafe way.
Then: the safe tree round-trips every type the engine state holds, malformed safe files are refused
in one line.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from conftest import reset_accelerate_state
from gan_accel.errors import CheckpointError, GanAccelError, UnsafeFileError
from gan_accel.storage.layout import ENGINE_STATE, FIXED_LABELS, FIXED_NOISE, RNG_STATE
from gan_accel.storage.safe_tree import TREE_KEY, load_tree, save_tree
from cli_runs import CK2, cli, error_line, train

STATE_0 = ENGINE_STATE.format(rank=0)


class Payload:
    """Unpickled with full pickle, this creates the folder ``marker``: proof that code in the file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def plant(path: Path, marker: Path, legacy_pickle: bool = False) -> None:
    """Replace ``path`` with a pickle holding the payload."""
    value = {"evil": Payload(marker)}
    path.unlink(missing_ok=True)
    if legacy_pickle:  # a plain pickle, as torch.save wrote before its zip format
        path.write_bytes(pickle.dumps(value, protocol=2))
    else:
        torch.save(value, path)


def one_line_naming(error: BaseException | str, path: Path) -> str:
    text = str(error)
    assert "\n" not in text and str(path) in text, text
    return text


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-step run with an EMA: generator/, one checkpoint (step 2), fixed noise."""
    out = tmp_path_factory.mktemp("safe") / "run"
    train(out, steps=2)
    return out


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def test_the_payload_runs_code_when_unpickled_unsafely(tmp_path):
    """The test's teeth: the same file loaded the old way (weights_only=False) runs the payload."""
    marker = tmp_path / "PAYLOAD_RAN"
    plant(tmp_path / "x.pt", marker)
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert marker.exists()


# -- resuming: every file of a checkpoint ---------------------------------------------------------------
CHECKPOINT_FILES = ["optimizer.bin", "optimizer_1.bin", "scheduler.bin", "scheduler_1.bin", RNG_STATE.format(rank=0),
                    "sampler.bin", "scaler.pt", "custom_checkpoint_0.pkl", "pytorch_model.bin"]


def test_a_payload_in_any_checkpoint_file_is_refused_by_resume(run, tmp_path, capsys):
    """fit(resume_from=...) and 'latest': each of Accelerate's pickles (also ones it reads with weights_only=False,
    like register_for_checkpointing's custom_checkpoint_N.pkl, or none at all here)."""
    checkpoint = run / "checkpoints" / CK2
    pristine = tmp_path / "pristine"
    shutil.copytree(checkpoint, pristine)
    marker = tmp_path / "PAYLOAD_RAN"
    for victim in CHECKPOINT_FILES:
        for legacy in (False, True):
            plant(checkpoint / victim, marker, legacy_pickle=legacy)
            for resume_from in ("latest", str(checkpoint)):
                with pytest.raises(UnsafeFileError) as caught:
                    train(run, steps=2, resume_from=resume_from)
                line = one_line_naming(caught.value, checkpoint / victim)
                assert "unpickling it could run code" in line and "posix.mkdir" in line, line
            assert not marker.exists(), victim
            shutil.rmtree(checkpoint)
            shutil.copytree(pristine, checkpoint)
    train(run, steps=2, resume_from="latest")  # the pristine checkpoint still resumes


def test_a_payload_in_the_fixed_noise_or_labels_is_refused(run, tmp_path):
    from gan_accel.storage.run_folder import read_fixed_latents

    marker = tmp_path / "PAYLOAD_RAN"
    for name in (FIXED_NOISE, FIXED_LABELS):
        if name == FIXED_LABELS:
            save_tree(torch.zeros(2, 8), run / FIXED_NOISE)
        plant(run / name, marker)
        with pytest.raises(UnsafeFileError) as caught:
            read_fixed_latents(run)
        one_line_naming(caught.value, run / name)
    assert not marker.exists()


def test_the_rng_check_never_unpickles_more_than_accelerate_allows(run, tmp_path):
    """check_rng_restored used weights_only=False: a payload ran after Accelerate had refused the file."""
    from accelerate import Accelerator

    from gan_accel.storage.checkpoint import check_rng_restored

    checkpoint = run / "checkpoints" / CK2
    plant(checkpoint / RNG_STATE.format(rank=0), tmp_path / "PAYLOAD_RAN")
    reset_accelerate_state()
    with pytest.raises(UnsafeFileError) as caught:
        check_rng_restored(Accelerator(cpu=True), checkpoint)
    one_line_naming(caught.value, checkpoint / RNG_STATE.format(rank=0))
    assert not (tmp_path / "PAYLOAD_RAN").exists()


# -- the command line: sample, eval, info ---------------------------------------------------------------
def test_sample_eval_and_info_refuse_or_ignore_a_poisoned_run(run, tmp_path, capsys, monkeypatch):
    marker = tmp_path / "PAYLOAD_RAN"
    checkpoint = run / "checkpoints" / CK2
    plant(checkpoint / STATE_0, marker)
    for argv in (["sample", checkpoint, "--out", tmp_path / "a.png"],
                 ["sample", checkpoint, "--no-ema", "--out", tmp_path / "b.png"],
                 ["sample", run, "--no-ema", "--out", tmp_path / "c.png"],
                 ["eval", checkpoint, "--num", 10]):
        line = error_line(argv, capsys)
        assert str(checkpoint / STATE_0) in line, line
    # info reads JSON only; odd JSON in every file it reads is a note, never a traceback
    (checkpoint / "COMPLETE").write_text("[1, 2")
    (run / "config.json").write_text('["not", "a", "config"]')
    (run / "best.json").write_text("123")
    (run / "eval.json").write_text('{"fd": NaN, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (run / "history.jsonl").write_text('{"event": "start"}\n[1]\n"text"\n')
    (run / "trackers").mkdir()
    (run / "trackers" / "runs.json").write_text("[]")
    code, out, err = cli(["info", run, "--json"], capsys)
    assert code == 0 and "Traceback" not in err, err
    report = json.loads(out)
    assert any("eval.json" in note for note in report["notes"])
    assert not marker.exists()


def test_a_poisoned_classifier_cache_is_refused_by_eval(run, tmp_path, capsys, monkeypatch):
    """The judge of ``gan-accel eval`` is read with safetensors; a pickle (with a payload) in its place is refused."""
    cache = tmp_path / "cache"
    cache.mkdir()
    judge = cache / "offline-digits_classifier.safetensors"
    plant(judge, tmp_path / "PAYLOAD_RAN")
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(cache))
    line = error_line(["eval", run / "checkpoints" / CK2, "--num", 10], capsys)
    assert str(judge) in line and "delete the file to retrain it" in line, line
    assert not (tmp_path / "PAYLOAD_RAN").exists()


def test_poisoned_inception_weights_are_refused_before_torch_fidelity_reads_them(tmp_path):
    """torch-fidelity reads its weights with a plain torch.load (weights_only=False before torch 2.6)."""
    from gan_accel.eval.inception import InceptionUnavailable, _torch_fidelity_backend

    weights = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    plant(weights, tmp_path / "PAYLOAD_RAN")
    with pytest.raises(InceptionUnavailable) as caught:
        _torch_fidelity_backend(str(weights), ["2048"])
    one_line_naming(caught.value, weights)
    assert not (tmp_path / "PAYLOAD_RAN").exists()


# -- safe files that are not what they claim ------------------------------------------------------------
def _tree_file(path: Path, text: str, tensors: dict | None = None) -> None:
    from safetensors.torch import save_file

    path.unlink(missing_ok=True)
    save_file(tensors or {}, str(path), metadata={TREE_KEY: text})


MALFORMED = {
    "not JSON": "{not json",
    "a huge number": '{"format": "gan_accel.tree/1", "tree": ' + "9" * 5000 + "}",
    "NaN constant": '{"format": "gan_accel.tree/1", "tree": NaN}',
    "deep nesting": '{"format": "gan_accel.tree/1", "tree": ' + "[" * 200_000 + "]" * 200_000 + "}",
    "another format": '{"format": "gan_accel.tree/99", "tree": {}}',
    "a missing tensor": '{"format": "gan_accel.tree/1", "tree": {"tensor": "7"}}',
    "an unknown node": '{"format": "gan_accel.tree/1", "tree": {"object": "os.system"}}',
    "a list key": '{"format": "gan_accel.tree/1", "tree": {"pairs": [[[1], 2]]}}',
    "not an engine state": '{"format": "gan_accel.tree/1", "tree": [1, 2, 3]}',
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_engine_state_is_refused_in_one_line(run, tmp_path, capsys, case):
    checkpoint = run / "checkpoints" / CK2
    _tree_file(checkpoint / STATE_0, MALFORMED[case])
    line = error_line(["sample", checkpoint, "--out", tmp_path / "a.png"], capsys)
    assert str(checkpoint / STATE_0) in line, line
    with pytest.raises(CheckpointError) as caught:
        train(run, steps=2, resume_from="latest")
    one_line_naming(caught.value, checkpoint / STATE_0)


def test_a_state_file_that_is_not_a_regular_file_is_refused_not_waited_on(run, tmp_path, capsys):
    """A FIFO would block a reader forever and a device never ends; a symlink to a real state file is read."""
    checkpoint = run / "checkpoints" / CK2
    state = checkpoint / STATE_0
    elsewhere = tmp_path / "elsewhere.safetensors"
    shutil.move(state, elsewhere)
    os.mkfifo(state)
    assert "is not a regular file" in error_line(["sample", checkpoint, "--out", tmp_path / "a.png"], capsys)
    with pytest.raises(UnsafeFileError, match="is not a regular file"):
        train(run, steps=2, resume_from="latest")
    state.unlink()
    state.symlink_to("/dev/zero")
    assert "is not a regular file" in error_line(["sample", checkpoint, "--out", tmp_path / "b.png"], capsys)
    state.unlink()
    state.symlink_to(elsewhere)
    assert cli(["sample", checkpoint, "--num", 4, "--out", tmp_path / "c.png"], capsys)[0] == 0


def test_an_odd_generator_config_is_one_line(run, tmp_path, capsys):
    config_file = run / "generator" / "config.json"
    config = json.loads(config_file.read_text())
    for text, says in (("[1, 2]", "is not a gan_accel generator's config"), ("{oops", "is not valid JSON"),
                       (json.dumps({**config, "model": {**config["model"], "z_dim": 10**12}}),
                        "beyond what gan_accel builds"),
                       (json.dumps({**config, "model": "text"}), "records no model spec"),
                       (json.dumps({**config, "weights": {"ema": True, "step": "../../x"}}), "which is not a step")):
        config_file.write_text(text)
        line = error_line(["sample", run, "--no-ema", "--out", tmp_path / "x.png"], capsys)
        assert str(run / "generator") in line and says in line, line
        code, _, err = cli(["info", run], capsys)
        assert code == 0 and "Traceback" not in err
    config_file.unlink()
    os.mkfifo(config_file)  # a FIFO would block a reader forever: it is refused, not read
    line = error_line(["sample", run, "--out", tmp_path / "x.png"], capsys)
    assert "is not a regular file" in line, line


def test_a_garbage_complete_marker_is_named_as_damaged_before_a_resume_loads_anything(run):
    """COMPLETE is JSON written by gan_accel: garbage or a non-object there has no keys to read, and a resume names
    the marker as damaged instead of going on without its checks; an empty marker (an old run's) still resumes."""
    from gan_accel.storage.checkpoint import read_marker

    checkpoint = run / "checkpoints" / CK2
    for text in ("[1]", "{oops", '"text"', "null"):
        (checkpoint / "COMPLETE").write_text(text)
        assert read_marker(checkpoint) == {}
        with pytest.raises(CheckpointError, match="COMPLETE is damaged"):
            train(run, steps=2, resume_from="latest")
    (checkpoint / "COMPLETE").write_text("")
    train(run, steps=2, resume_from="latest")


# -- the safe tree ----------------------------------------------------------------------------------------
def test_every_value_the_engine_state_holds_round_trips_exactly(tmp_path):
    from collections import OrderedDict

    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    tree = {
        "ints": [0, -1, 2**70, True, False], "floats": [0.1, -0.0, 1e-310, float("nan"), float("inf"), float("-inf")],
        "none": None, "text": ["", "ü", "shared: saved by the main process"], "tuple": (1, (2.5, None), []),
        "empty": {"d": {}, "l": [], "t": ()},
        "keys": {7: "int", 2.5: "float", None: "none", True: "bool", ("a", 1): "tuple"},
        "tag-like": {"tensor": "0", "dict": {"float": "nan"}, "pairs": [1], "tuple": []},
        "tensors": {str(dtype): torch.ones(2, 3, dtype=dtype) for dtype in
                    (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int32,
                     torch.int64, torch.bool)},
        "scalar": torch.tensor(3.25), "no elements": torch.zeros(0, 5), "view": base[:, 1], "same storage": base,
        "odict": OrderedDict([("b", torch.randn(2)), ("a", 1)]),
        "means": {"loss/D": (None, 3, torch.randn(3)), "loss/G": (torch.tensor(1.5), 64, torch.zeros(0))},
        "latents": ({"z": torch.randn(4, 8)}, [torch.randn(4)]),
        "nan tensor": torch.tensor([float("nan"), -0.0, float("inf")]),
    }
    back = load_tree(save_tree(tree, tmp_path / "tree.safetensors"))

    def same(a, b, where="tree"):
        assert type(a) is type(b) or isinstance(a, dict), f"{where}: {type(a)} != {type(b)}"
        if isinstance(a, torch.Tensor):
            bits = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731 - NaN, -0.0: by their bits
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b)), where
        elif isinstance(a, dict):
            assert list(a) == list(b), where
            for k in a:
                same(a[k], b[k], f"{where}[{k!r}]")
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{where}[{i}]")
        elif isinstance(a, float) and a != a:
            assert b != b, where
        else:
            assert a == b and repr(a) == repr(b), where

    same(tree, back)
    assert type(back["odict"]) is dict  # documented: dicts come back as dicts


def test_the_trainers_own_state_round_trips_exactly(tmp_path):
    """What a checkpoint holds today: the trainer's state_dict (EMA, guard, health, phases, means, config)."""
    from test_resume import assert_identical, build_trainer

    trainer = build_trainer(str(tmp_path / "run"), r1_gamma=1.0, r1_every=2, log_every=100)
    trainer.fit(stop_at_step=2)
    state = trainer.state_dict()
    assert state["means"], "running means are part of the state between log rows"
    assert_identical(state, load_tree(save_tree(state, tmp_path / "state.safetensors")))


@pytest.mark.parametrize("value, says", [
    (pickle, "module"), ({"a": [1, {2, 3}]}, "['a'][1] is a set"), (b"bytes", "is a bytes"),
    ({"cb": __import__("numpy").zeros(2)}, "['cb'] is a numpy.ndarray"), ({"k": Payload("x")}, "['k'] is a "),
    ({torch.zeros(1): 1}, "has a key of type torch.Tensor"), (torch.zeros(2).to_sparse(), "only dense tensors"),
], ids=["module", "set", "bytes", "numpy", "object", "tensor key", "sparse"])
def test_saving_anything_else_is_refused_naming_where_it_is(tmp_path, value, says):
    with pytest.raises(CheckpointError) as caught:
        save_tree(value, tmp_path / "x.safetensors")
    assert says in str(caught.value) and "x.safetensors" in str(caught.value)
    assert not (tmp_path / "x.safetensors").exists()


def test_a_callback_with_unsaveable_state_stops_the_checkpoint_with_its_name(tmp_path):
    from gan_accel import Callback

    class NumpyState(Callback):
        def state_dict(self):
            return {"rng": __import__("numpy").random.get_state()}

    with pytest.raises(GanAccelError, match=r"\['callbacks'\]\['numpy_state'\]\['rng'\]\[1\] is a numpy.ndarray"):
        train(tmp_path / "run", steps=2, callbacks=[NumpyState()])
