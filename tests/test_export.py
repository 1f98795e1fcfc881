"""``gan-accel export``, ``gan_accel.load_generator`` and the Hub methods of what it returns: a run ends with its
generator in the export format (``generator/``: config.json, model.safetensors); the export is that layout plus a
README.md model card and samples.png, as ``G.save_pretrained`` and ``G.push_to_hub`` write it, loads back without
training code and samples bitwise what ``gan-accel sample`` samples from the run; one ``load_generator`` (and
``from_pretrained``) reads an export, a run, a checkpoint and a Hub repo alike, checking what the files ask for
before building anything; the card's metadata parses as YAML with its model-index, and its usage snippet runs as
written; nothing is replaced; pushing and loading a repo id work up to the network, against a local stand-in for
the Hub (tests/hub_stand_in.py): the real Hub is never reached from these tests.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import reset_accelerate_state
from hub_stand_in import StandInHub
from gan_accel import CheckpointError, load_generator
from gan_accel.cli import main
from gan_accel.hub import ExportError, HubGenerator, export_generator
from gan_accel.sampling import sample_images
from test_train_cli import CLASSES, TINY, error_line, gan_accel, snapshot, write_images


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished runs of ``gan-accel train``: unconditional with evaluation (best.json), and conditional."""
    root = tmp_path_factory.mktemp("export")
    write_images(root / "photos", 24)
    write_images(root / "pets", 24, classes=CLASSES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GAN_ACCEL_CACHE", str(root / "cache"))
        for name, extra in (("plain", ["--eval-every", "2", "--eval-samples", "16", "--eval-features", "random"]),
                            ("cond", ["--conditional"])):
            reset_accelerate_state()
            data = root / ("pets" if name == "cond" else "photos")
            assert main(["train", "--data", str(data), "--output-dir", str(root / name), "--resolution", "32",
                         "--steps", "4", *TINY, *extra]) == 0
        reset_accelerate_state()
    return root


def front_matter(card: str) -> dict:
    """The card's YAML front matter, parsed by PyYAML (not by huggingface_hub, which wrote it)."""
    block = re.match(r"---\n(.*?)\n---\n", card, re.DOTALL)
    assert block, "the card starts with a YAML front matter block"
    return yaml.safe_load(block.group(1))


def test_export_loads_back_and_samples_bitwise_what_gan_accel_sample_samples(runs, tmp_path, capsys):
    run, out = runs / "plain", tmp_path / "plain_gan"
    code, stdout, err = gan_accel(["export", run, out], capsys)
    assert code == 0, err
    assert "the EMA of G of step 4" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors", "samples.png"]
    assert gan_accel(["sample", run, "--num", 10, "--seed", 3, "--out", tmp_path / "s.npz"], capsys)[0] == 0
    G = load_generator(out)
    images, _ = sample_images(G, 10, seed=3)
    np.testing.assert_array_equal(images.numpy(), np.load(tmp_path / "s.npz")["images"])
    # the run ended with the same layout: the export is its copy (weights byte for byte: the EMA of G) plus the card
    assert sorted(p.name for p in (run / "generator").iterdir()) == ["config.json", "model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == (run / "generator" / "model.safetensors").read_bytes()
    assert json.loads((out / "config.json").read_text()) == json.loads((run / "generator" / "config.json").read_text())
    final = load_file(str(run / "generator" / "model.safetensors"))
    with torch.no_grad():  # and those weights are what the run's G makes: the same samples from its own folder
        assert torch.equal(sample_images(load_generator(run / "generator"), 10, seed=3)[0], images)
    assert all(torch.equal(G.state_dict()[k], final[k]) for k in final)


def test_config_json_rebuilds_G_and_says_what_the_weights_are(runs, tmp_path, capsys):
    run, out = runs / "cond", tmp_path / "cond_gan"
    assert gan_accel(["export", run, out], capsys)[0] == 0
    config = json.loads((out / "config.json").read_text())
    recorded = json.loads((run / "config.json").read_text())
    assert config["model"] == recorded["model"] and config["class_names"] == list(CLASSES)
    assert config["weights"] == {"file": "model.safetensors", "ema": True, "has_ema": True, "step": 4,
                                 "dtype": "float32"}
    assert config["output"] == {"shape": [3, 32, 32], "range": [-1, 1]} and config["latent"]["shape"] == [100]
    assert config["data"]["images"] == 24 and config["data"]["classes"] == {name: 8 for name in CLASSES}
    for name in ("config.json", "README.md"):  # paths on this machine are cut to their last part
        assert str(runs) not in (out / name).read_text(), name
    G = load_generator(out)
    assert G.class_names == list(CLASSES)
    assert gan_accel(["sample", run, "--label", "owls", "--num", 4, "--out", tmp_path / "owls.npz"], capsys)[0] == 0
    images, _ = sample_images(G, 4, label=2)
    np.testing.assert_array_equal(images.numpy(), np.load(tmp_path / "owls.npz")["images"])


def test_the_model_card_has_hub_metadata_and_its_usage_snippet_runs(runs, tmp_path, monkeypatch, capsys):
    for name, tag in (("plain", "unconditional-image-generation"), ("cond", "class-conditional")):
        out = tmp_path / f"{name}_gan"
        assert gan_accel(["export", runs / name, out, "--license", "apache-2.0"], capsys)[0] == 0
        card = (out / "README.md").read_text()
        meta = front_matter(card)
        assert meta["library_name"] == "gan_accel" and meta["license"] == "apache-2.0"
        assert {"gan", "image-generation", tag} <= set(meta["tags"])
        assert ("pipeline_tag" in meta) == (name == "plain")
        assert "![samples](samples.png)" in card and "## Data" in card and "## Training" in card
        assert "datasets" not in meta, "local images have no Hub id"
        if name == "plain":  # the evaluation during training, in the feature space it used
            best = json.loads((runs / "plain" / "best.json").read_text())
            assert f"at step {best['step']}" in card and "random-conv-v1" in card
            # the model-index holds the score of the exported weights (step 4) only
            indexed = meta["model-index"][0]["results"][0]["metrics"] if best["step"] == 4 else None
            assert indexed is None or indexed[0] == {"type": "fd", "name": "Frechet distance", "config":
                                                     "random-conv-v1", "value": best["scores"]["fd"]}
            assert ("model-index" in meta) == (best["step"] == 4)
        (snippet,) = re.findall(r"```python\n(.*?)```", card, re.DOTALL)
        monkeypatch.chdir(tmp_path)
        namespace: dict = {}
        exec(compile(snippet, f"{name} model card", "exec"), namespace)
        assert namespace["images"].shape == (16, 3, 32, 32) and (tmp_path / "generated.png").is_file()
        (tmp_path / "generated.png").unlink()


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_exported_file_has_the_mode_the_umask_gives(runs, tmp_path, capsys, umask):
    """model.safetensors like the others: 0644 under the usual umask (a copied or served export is readable)."""
    import os
    import stat

    before = os.umask(umask)
    try:
        assert gan_accel(["export", runs / "plain", tmp_path / "gan"], capsys)[0] == 0
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "gan").iterdir()}
    assert modes == dict.fromkeys(["README.md", "config.json", "model.safetensors", "samples.png"], 0o666 & ~umask)


def test_the_model_card_names_no_path_of_this_machine(runs, tmp_path, capsys):
    out = tmp_path / "deep" / "inside" / "my_gan"
    out.parent.mkdir(parents=True)
    assert gan_accel(["export", runs / "plain", out], capsys)[0] == 0
    card = (out / "README.md").read_text()
    assert str(tmp_path) not in card and "load_generator('my_gan')" in card


def test_an_existing_folder_is_never_replaced(runs, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    line = error_line(["export", runs / "plain", out], capsys)
    assert "that folder exists, and gan-accel never replaces anything" in line, line
    assert snapshot(out) == {"mine.txt": b"keep me"}
    assert "does not exist" in error_line(["export", runs / "nowhere", tmp_path / "x"], capsys)
    assert not (tmp_path / "x").exists()


def test_a_checkpoint_exports_its_raw_G_with_no_ema(runs, tmp_path, capsys):
    checkpoint = runs / "plain" / "checkpoints" / "checkpoint_00000002"
    out = tmp_path / "raw"
    code, stdout, err = gan_accel(["export", checkpoint, out, "--no-ema"], capsys)
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["weights"]["ema"] is False and "raw G of step 2" in stdout
    exported, raw = load_file(str(out / "model.safetensors")), load_file(str(checkpoint / "model.safetensors"))
    assert all(torch.equal(exported[k], raw[k]) for k in exported)


def test_load_generator_reads_runs_and_checkpoints_too(runs):
    G = load_generator(runs / "cond")
    assert G.class_names == list(CLASSES) and not G.training
    G_checkpoint = load_generator(runs / "cond" / "checkpoints" / "checkpoint_00000004")
    for name, value in G.state_dict().items():
        assert torch.equal(value, G_checkpoint.state_dict()[name]), name
    # one description whatever the source: the export format's config.json
    assert G_checkpoint.class_names == G.class_names and G_checkpoint.info["model"] == G.info["model"]
    assert G.info["weights"] == {**G_checkpoint.info["weights"]} == {"file": "model.safetensors", "ema": True,
                                                                     "has_ema": True, "step": 4, "dtype": "float32"}
    with pytest.raises(ExportError, match="does not exist"):
        load_generator("./nowhere/at_all")


def edited_export(runs, tmp_path, **changes):
    """A copy of the conditional run's generator folder whose config.json has ``changes`` (nested one level)."""
    folder = tmp_path / "edited"
    shutil.copytree(runs / "cond" / "generator", folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("model, says", [
    ({"width": 100_000}, "records a model spec with width=100000, beyond what gan_accel builds (at most 8,192)"),
    ({"z_dim": 3e9}, "records a model spec with z_dim=3000000000.0, beyond what gan_accel builds (at most 65,536)"),
    ({"num_classes": 4}, "the weights do not fit the model its recorded spec describes (embed.weight: (3, 50) in the "
                         "file, (4, 50) in the spec)"),
])
def test_an_edited_config_is_refused_before_G_is_built(runs, tmp_path, monkeypatch, model, says):
    import gan_accel.hub.load as load

    devices, build = [], load.build_generator
    monkeypatch.setattr(load, "build_generator",
                        lambda spec: devices.append(str(torch.get_default_device())) or build(spec))
    folder = edited_export(runs, tmp_path, model=model)
    with pytest.raises(CheckpointError) as error:
        load_generator(folder)
    assert says in str(error.value) and "\n" not in str(error.value)
    assert all(device == "meta" for device in devices), "nothing was built for real"


@pytest.mark.parametrize("named", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/model.safetensors"])
def test_weights_named_outside_their_folder_are_refused(runs, tmp_path, named):
    outside = tmp_path / "outside.safetensors"  # a valid file: followed, it would load
    shutil.copy(runs / "cond" / "generator" / "model.safetensors", outside)
    folder = edited_export(runs, tmp_path, weights={"file": str(outside) if named.startswith("/") else named})
    (folder / "model.safetensors").unlink()
    with pytest.raises(ExportError) as error:
        load_generator(folder)
    assert "gan_accel reads only model.safetensors inside the folder itself" in str(error.value)
    assert "\n" not in str(error.value)


# -- the Hub, through a stand-in ---------------------------------------------------------------------------------
@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> StandInHub:
    return StandInHub.installed(tmp_path / "hub", monkeypatch)


def test_push_to_hub_creates_the_repo_and_uploads_the_folder_without_printing_the_token(runs, tmp_path, stand_in,
                                                                                         capsys):
    out, token = tmp_path / "pets_gan", "hf_NotARealTokenButSecret"
    code, stdout, err = gan_accel(["export", runs / "cond", out, "--push-to-hub", "someone/pets-gan", "--private",
                                   "--token", token], capsys)
    assert code == 0, err
    assert stand_in.calls == [
        ("HfApi", {"token": token}),
        ("create_repo", {"repo_id": "someone/pets-gan", "repo_type": "model", "private": True, "exist_ok": True}),
        ("upload_folder", {"repo_id": "someone/pets-gan", "repo_type": "model"})]
    assert snapshot(stand_in.root / "someone" / "pets-gan") == snapshot(out)
    assert token not in stdout + err and "pushed" in stdout
    assert "load_generator('someone/pets-gan')" in (out / "README.md").read_text(), "the snippet names the repo"


def test_load_generator_of_a_repo_id_downloads_through_the_stand_in(runs, tmp_path, stand_in, capsys):
    assert gan_accel(["export", runs / "plain", tmp_path / "x", "--push-to-hub", "someone/plain"], capsys)[0] == 0
    G = load_generator("someone/plain")
    assert stand_in.calls[-1] == ("snapshot_download", {"repo_id": "someone/plain", "allow_patterns": [
        "config.json", "model.safetensors", "README.md", "samples.png"]})
    local = load_generator(tmp_path / "x")
    for name, value in local.state_dict().items():
        assert torch.equal(value, G.state_dict()[name]), name
    with pytest.raises(ExportError) as error:
        load_generator("someone/missing")
    assert "downloading it from the Hugging Face Hub failed (OSError: 404" in str(error.value)
    assert "\n" not in str(error.value)


def test_G_pushes_with_the_mixin_and_from_pretrained_reads_it_back_through_the_checks(runs, tmp_path, stand_in,
                                                                                       monkeypatch):
    import gan_accel.hub.load as load

    G = load_generator(runs / "plain")
    assert isinstance(G, huggingface_hub.PyTorchModelHubMixin) and type(G).__name__ == "DCGANGenerator"
    url = G.push_to_hub("someone/plain-gan", token="hf_Secret", commit_message="first")
    assert url == "https://huggingface.co/someone/plain-gan/commit/1"
    assert [name for name, _ in stand_in.calls] == ["HfApi", "create_repo", "upload_folder"]
    pushed = stand_in.root / "someone" / "plain-gan"
    exported, saved = tmp_path / "exported", tmp_path / "saved"
    G.save_pretrained(saved)
    assert export_generator(runs / "plain", exported) == exported
    # one format, three writers: the weights, config and grid byte for byte; the cards differ in what they load
    for folder, where in ((pushed, "someone/plain-gan"), (saved, "saved"), (exported, "exported")):
        files = snapshot(folder)
        assert sorted(files) == ["README.md", "config.json", "model.safetensors", "samples.png"]
        assert {k: v for k, v in files.items() if k != "README.md"} == {
            k: v for k, v in snapshot(exported).items() if k != "README.md"}
        assert f"load_generator({where!r})" in files["README.md"].decode()
    devices, build = [], load.build_generator  # the load goes through the checked path: the meta build first
    monkeypatch.setattr(load, "build_generator",
                        lambda spec: devices.append(str(torch.get_default_device())) or build(spec))
    back = type(G).from_pretrained("someone/plain-gan")
    assert devices == ["meta", "cpu"] and stand_in.calls[-1][0] == "snapshot_download"
    assert torch.equal(sample_images(back, 10, seed=3)[0], sample_images(G, 10, seed=3)[0])  # bitwise
    assert HubGenerator.from_pretrained(saved).info == G.info
    copied = pickle.loads(pickle.dumps(back))  # a loaded G pickles as its own class, the Hub methods kept
    assert type(copied).__mro__[1] is type(G).__mro__[1] and hasattr(copied, "push_to_hub")
    assert torch.equal(sample_images(copied, 10, seed=3)[0], sample_images(G, 10, seed=3)[0])
    with pytest.raises(ExportError, match="holds a ConditionalDCGANGenerator, not a DCGANGenerator: load it with"):
        type(G).from_pretrained(runs / "cond" / "generator")


def test_a_failed_push_is_one_line_without_the_token(runs, stand_in):
    def refused(self, **kwargs):
        raise OSError("403 Forbidden: hf_Secret cannot write to someone/x")

    stand_in.HfApi.upload_folder = refused
    with pytest.raises(ExportError) as error:
        load_generator(runs / "plain").push_to_hub("someone/x", token="hf_Secret")
    assert str(error.value) == ("could not push G to the Hugging Face Hub as someone/x (OSError: 403 Forbidden: *** "
                                "cannot write to someone/x): check the repo id, your access and the network")


def test_huggingface_hub_is_a_dependency_not_an_extra():
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("huggingface_hub") for dep in project["dependencies"])
    assert "hub" not in project["optional-dependencies"]


def test_a_full_disk_during_export_is_one_line_and_leaves_no_folder(runs, tmp_path, monkeypatch, capsys):
    import errno
    import os

    import gan_accel.storage.weights as weights

    def full(*args, **kwargs):  # what the file system raises when the disk fills up under the weights' write
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(weights, "write_bytes_synced", full)
    line = error_line(["export", runs / "plain", tmp_path / "out"], capsys)
    assert "No space left on device (ENOSPC)" in line and f"DIR {tmp_path / 'out'}: cannot write it" in line, line
    assert list(tmp_path.iterdir()) == [], "neither the folder nor its temporary twin is left"


@pytest.mark.parametrize("edit, section", [
    (lambda c: c.__setitem__("training", [1]), "training"),
    (lambda c: c["data"].__setitem__("images", "many"), "data"),
    (lambda c: c["data"].__setitem__("classes", [1, 2]), "data"),
    (lambda c: c.pop("gan_accel_version"), None),
])
def test_odd_metadata_in_a_run_gives_a_card_that_says_so(runs, tmp_path, capsys, edit, section):
    run = tmp_path / "run"
    shutil.copytree(runs / "plain", run)
    config = json.loads((run / "generator" / "config.json").read_text())
    edit(config)
    (run / "generator" / "config.json").write_text(json.dumps(config))
    code, _, err = gan_accel(["export", run, tmp_path / "out"], capsys)
    assert code == 0 and "Traceback" not in err, err
    card = (tmp_path / "out" / "README.md").read_text()
    if section:
        assert f"The run's `config.json` holds no readable {section} record." in card
    assert "## Usage" in card and "## Model" in card


def test_the_card_indexes_the_saved_weights_scores_in_their_feature_space():
    from gan_accel.hub.card import model_card

    best = {"step": 400, "metric": "fid", "value": 31.5, "scores": {"fid": 31.5, "kid": 0.02, "precision": 0.625,
                                                                     "recall": 0.375, "kid_std": 0.001}}
    config = {"gan_accel_version": "0", "model": {"family": "resnet", "image_size": 64, "channels": 3, "z_dim": 8,
                                                  "width": 8, "num_classes": None},
              "weights": {"ema": True, "has_ema": True, "step": 400}, "training": {"extra": {
                  "eval_features": "inception-v3-2048"}}, "scores": {"best": best, "eval": None},
              "data": {"images": 9, "source": "Hugging Face dataset someone/cats [train]", "resolution": 64,
                       "channels": 3, "crop": "center"}}
    meta = front_matter(str(model_card(config, "someone/cats-gan", 10, "mit")))
    assert meta["datasets"] == ["someone/cats"] and meta["license"] == "mit" and meta["library_name"] == "gan_accel"
    (entry,) = meta["model-index"]
    (result,) = entry["results"]
    assert entry["name"] == "Resnet generator, 64 px"
    assert result["task"] == {"type": "unconditional-image-generation"}
    assert result["dataset"] == {"type": "someone/cats", "name": "someone/cats"}
    space = "inception-v3-2048"
    assert result["metrics"] == [{"type": "fid", "name": "FID", "value": 31.5, "config": space},
                                 {"type": "kid", "name": "KID", "value": 0.02, "config": space},
                                 {"type": "precision", "name": "precision", "value": 0.625, "config": space},
                                 {"type": "recall", "name": "recall", "value": 0.375, "config": space}]
    best["step"] = 300  # the best evaluation of another step scores other weights: no model-index
    assert "model-index" not in front_matter(str(model_card(config, "x", 10)))
    config["scores"]["eval"] = {"fd": 7.0, "reference": "mnist"}  # a final evaluation in the MNIST classifier's
    (metric,) = front_matter(str(model_card(config, "x", 10)))["model-index"][0]["results"][0]["metrics"]
    assert metric == {"type": "fd", "name": "Frechet distance", "value": 7.0, "config": "mnist-classifier"}
    # precision and recall measured in VGG-16 fc2 features say so, beside an FID in Inception's
    config["scores"]["eval"] = {"fid": 20.0, "precision_vgg16-fc2": 0.5, "recall_vgg16-fc2": 0.25, "features": space,
                                "pr_features": "vgg16-fc2"}
    metrics = front_matter(str(model_card(config, "x", 10)))["model-index"][0]["results"][0]["metrics"]
    assert metrics == [{"type": "fid", "name": "FID", "value": 20.0, "config": space},
                       {"type": "precision", "name": "precision", "value": 0.5, "config": "vgg16-fc2"},
                       {"type": "recall", "name": "recall", "value": 0.25, "config": "vgg16-fc2"}]


def test_names_from_the_data_are_escaped_in_the_card(tmp_path, capsys):
    from gan_accel.hub.card import model_card

    forged = "a\n# forged\x1b[31m"
    config = {"gan_accel_version": "1\n# v", "model": {"family": "dcgan", "image_size": 32, "channels": 3, "z_dim": 8,
              "num_classes": 2}, "class_names": [forged, "b"], "weights": {"ema": True, "has_ema": True, "step": 2},
              "data": {"images": 4, "source": forged, "resolution": 32, "channels": 3, "crop": "center",
                       "classes": {forged: 2, "b": 2}}, "training": {"extra": {}}, "scores": {}}
    card = str(model_card(config, "out", 10))
    assert "\x1b" not in card and "\n# forged" not in card and "\n# v" not in card
    assert "from `a\\n# forged\\x1b[31m` at 32 px" in card and "a\\n# forged\\x1b[31m (2)" in card  # escaped


def test_sample_and_eval_take_an_export_folder_and_name_its_damage(runs, tmp_path, capsys):
    exported = tmp_path / "exported"
    assert gan_accel(["export", runs / "plain", exported], capsys)[0] == 0
    code, out, _ = gan_accel(["sample", exported, "--num", "4", "--out", tmp_path / "grid.png"], capsys)
    assert code == 0 and (tmp_path / "grid.png").is_file(), out
    # --no-ema on an export (the EMA only) is refused, never answered with the EMA
    assert error_line(["sample", exported, "--no-ema", "--out", tmp_path / "raw.png"], capsys) == (
        f"error: {exported} holds the EMA of G only, not the raw G that ema=False (--no-ema) asks for: pass the run "
        "folder or a checkpoint of it, or export it with --no-ema")
    # a damaged config.json is named, not taken for a run folder without generator/
    (exported / "config.json").write_text("{")
    line = error_line(["sample", exported, "--out", tmp_path / "damaged.png"], capsys)
    assert line.startswith(f"error: {exported / 'config.json'} is not valid JSON (")
    with pytest.raises(ExportError, match="is not valid JSON"):
        load_generator(exported)


def test_a_bad_spec_in_config_json_names_config_json(runs, tmp_path):
    folder = edited_export(runs, tmp_path, model={"width": float("nan")})
    with pytest.raises(CheckpointError) as error:
        load_generator(folder)
    assert str(error.value).startswith(f"{folder / 'config.json'} records a model spec gan_accel cannot rebuild "
                                       "(width=nan")
