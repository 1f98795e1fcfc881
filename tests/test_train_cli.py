"""``gan-accel train`` on your own images: a folder (RGB, grayscale, class folders), a ZIP and a Hugging Face
imagefolder train the model that fits them, the run folder keeps the data's files and the networks' spec,
``gan-accel sample --label`` takes a class name or its index, a resume continues and refuses data that changed
under it, and every mistake is one ``error:`` line (exit 2) with nothing written. The slow test launches the
command on two gloo processes.

Checked against independent computations: the model spec against the registry's ``default_spec``, the
default resolution against the images' sizes, the fingerprint against ``open_image_data``, the samples of a
class name against those of its index, the data's files against what the images are.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import reset_accelerate_state, free_port
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.cli import main
from gan_accel.models import default_spec

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--batch-size", "8", "--width", "4", "--sample-every", "2", "--log-every", "1", "--checkpoint-every", "2",
        "--no-progress"]
CLASSES = ("cats", "dogs", "owls")


def write_images(folder: Path, count: int, size: tuple[int, int] = (40, 36), grey: bool = False,
                 classes: tuple[str, ...] = (), seed: int = 0) -> list[Path]:
    """``count`` smooth random PNGs (in class subfolders, in turn, when ``classes`` are given)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        small = rng.integers(0, 256, (4, 4) if grey else (4, 4, 3), dtype=np.uint8)
        image = Image.fromarray(small, "L" if grey else "RGB").resize(size, Image.BICUBIC)
        path = folder / (classes[i % len(classes)] if classes else "") / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        paths.append(path)
    return paths


def gan_accel(argv: list, capsys) -> tuple[int, str, str]:
    """``gan-accel ARGS`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    reset_accelerate_state()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    finally:
        reset_accelerate_state()
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(argv: list, capsys) -> str:
    code, out, err = gan_accel(argv, capsys)
    assert code == 2, (out, err[-3000:])
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """The image cache in a folder of the test's own, and no Hugging Face network access."""
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def rgb_run(tmp_path_factory):
    """4 steps on 40 RGB images of 40x36 (the default resolution is then 32), checkpoints every 2 steps."""
    root = tmp_path_factory.mktemp("rgb")
    write_images(root / "photos", 40)
    out = root / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GAN_ACCEL_CACHE", str(root / "cache"))
        reset_accelerate_state()
        assert main(["train", "--data", str(root / "photos"), "--output-dir", str(out), "--steps", "4", *TINY]) == 0
        reset_accelerate_state()
    return root, out


@pytest.fixture(scope="module")
def cond_run(tmp_path_factory):
    """A class-conditional run on three class folders of 8 RGB images each."""
    root = tmp_path_factory.mktemp("cond")
    write_images(root / "pets", 24, classes=CLASSES)
    out = root / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GAN_ACCEL_CACHE", str(root / "cache"))
        reset_accelerate_state()
        assert main(["train", "--data", str(root / "pets"), "--output-dir", str(out), "--conditional",
                     "--resolution", "32", "--steps", "2", *TINY]) == 0
        reset_accelerate_state()
    return root, out


# -- what a run records --------------------------------------------------------------------------------
def test_a_folder_trains_the_model_that_fits_it_and_the_run_keeps_its_data_files(rgb_run):
    root, out = rgb_run
    config = json.loads((out / "config.json").read_text())
    # 40x36 images: the largest DCGAN size at or below the median short side (36) is 32
    assert config["model"] == default_spec("dcgan", 32, channels=3, width=4)
    assert config["z_dim"] == 100 and config["max_steps"] == 4 and config["num_classes"] is None
    data = json.loads((out / "data.json").read_text())
    assert data["images"] == 40 and data["resolution"] == 32 and data["channels"] == 3 and data["class_names"] is None
    assert config["extra"]["data_fingerprint"] == data["fingerprint"] and config["extra"]["images"] == 40
    from gan_accel.data import open_image_data

    assert open_image_data(root / "photos", 32, labels="none", cache_dir=root / "cache", log=None).fingerprint == \
        data["fingerprint"]
    assert not (out / "class_names.json").exists()
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    from gan_accel import load_generator

    with torch.no_grad():
        assert load_generator(out)(torch.randn(2, 100)).shape == (2, 3, 32, 32)


def test_grayscale_images_train_a_one_channel_model_at_28_px(tmp_path, capsys):
    write_images(tmp_path / "grey", 16, size=(30, 30), grey=True)
    out = tmp_path / "run"
    code, stdout, err = gan_accel(["train", "--data", tmp_path / "grey", "--output-dir", out, "--steps", "1", *TINY],
                                  capsys)
    assert code == 0, err[-3000:]
    assert "28 px: the largest size gan_accel's models make for images whose median short side is 30 px" in stdout
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == default_spec("dcgan", 28, channels=1, width=4)


def test_conditional_run_keeps_its_class_names_and_samples_a_class_by_name_or_index(cond_run, tmp_path, capsys):
    _, out = cond_run
    assert json.loads((out / "class_names.json").read_text()) == list(CLASSES)
    config = json.loads((out / "config.json").read_text())
    assert config["num_classes"] == 3 and config["model"]["num_classes"] == 3 and config["extra"]["classes"] == 3
    assert json.loads((out / "data.json").read_text())["classes"] == {name: 8 for name in CLASSES}
    from gan_accel.storage.run_folder import read_fixed_latents

    assert torch.equal(read_fixed_latents(out)[1], torch.arange(3).repeat_interleave(8))
    by_name, by_index = tmp_path / "dogs.npz", tmp_path / "one.npz"
    assert gan_accel(["sample", out, "--label", "dogs", "--num", 6, "--out", by_name], capsys)[0] == 0
    assert gan_accel(["sample", out, "--label", "1", "--num", 6, "--out", by_index], capsys)[0] == 0
    named, indexed = np.load(by_name), np.load(by_index)
    assert named["labels"].tolist() == [1] * 6
    np.testing.assert_array_equal(named["images"], indexed["images"])
    line = error_line(["sample", out, "--label", "ferrets", "--out", tmp_path / "x.png"], capsys)
    assert "'ferrets' is not a class of this run (its 3 classes: 'cats', 'dogs', 'owls')" in line
    assert not (tmp_path / "x.png").exists()


def test_a_zip_and_an_imagefolder_dataset_train_like_the_folder(tmp_path, capsys):
    """The ZIP of a class-folder set and ``hf:FOLDER`` (datasets' imagefolder builder) give the same classes."""
    write_images(tmp_path / "pets", 16, classes=CLASSES[:2])
    with zipfile.ZipFile(tmp_path / "pets.zip", "w") as archive:
        for path in sorted((tmp_path / "pets").rglob("*.png")):
            archive.write(path, path.relative_to(tmp_path).as_posix())
    sources = [(tmp_path / "pets.zip", "zip")]
    try:
        import datasets  # noqa: F401
        sources.append((f"hf:{tmp_path / 'pets'}", "imagefolder"))
    except ImportError:
        pass
    for source, name in sources:
        out = tmp_path / name
        code, _, err = gan_accel(["train", "--data", source, "--output-dir", out, "--conditional", "--steps", "1",
                                  "--resolution", "32", *TINY], capsys)
        assert code == 0, err[-3000:]
        assert json.loads((out / "class_names.json").read_text()) == list(CLASSES[:2]), name
        assert json.loads((out / "data.json").read_text())["images"] == 16, name


def test_the_default_output_folder_is_named_after_the_data(tmp_path, monkeypatch, capsys):
    write_images(tmp_path / "holiday photos", 8)
    monkeypatch.chdir(tmp_path)
    code, _, err = gan_accel(["train", "--data", "holiday photos", "--steps", "1", *TINY], capsys)
    assert code == 0, err[-3000:]
    assert (tmp_path / "runs" / "holiday photos" / "generator" / "model.safetensors").is_file()
    from gan_accel.cli.train import default_output_dir

    assert default_output_dir("hf:user/pets:train") == "runs/pets" and default_output_dir("a/b.zip") == "runs/b"


# -- resume ----------------------------------------------------------------------------------------------
def test_resume_continues_and_refuses_changed_data_unless_asked(tmp_path, capsys):
    photos = write_images(tmp_path / "photos", 16)
    out = tmp_path / "run"
    base = ["train", "--data", tmp_path / "photos", "--output-dir", out, *TINY]
    assert gan_accel([*base, "--steps", "2"], capsys)[0] == 0
    code, stdout, err = gan_accel([*base, "--steps", "4", "--resume", "latest"], capsys)
    assert code == 0, err[-3000:]
    assert "resumed from" in stdout and [row["step"] for row in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [json.loads(line)["event"] for line in (out / "history.jsonl").read_text().splitlines()] == ["start", "resume"]

    before = snapshot(out)
    for flags, says in ((["--resolution", "28"], "--resolution 28 (the run's: 32)"),
                        (["--channels", "1", "--crop", "random"], "--channels 1 (the run's: 3), --crop random (the "
                                                                   "run's: center): a run resumes as it started")):
        line = error_line([*base, "--steps", "6", "--resume", "latest", *flags], capsys)
        assert says in line and "leave these flags out" in line and "data changed" not in line, line
        assert snapshot(out) == before

    write_images(tmp_path / "more", 1, seed=5)[0].rename(tmp_path / "photos" / "extra.png")
    line = error_line([*base, "--steps", "6", "--resume", "latest"], capsys)
    assert "the training data changed since this run started (images 16 -> 17)" in line
    assert "--allow-data-change" in line
    assert snapshot(out) == before, "a refused resume writes nothing into the run folder"

    code, stdout, err = gan_accel([*base, "--steps", "6", "--resume", "latest", "--allow-data-change"], capsys)
    assert code == 0, err[-3000:]
    assert "warning: the training data changed since this run started (images 16 -> 17); going on" in stdout
    assert json.loads((out / "data.json").read_text())["images"] == 17, "the run now describes the data it goes on with"
    assert read_metrics(out / "metrics.jsonl")[-1]["step"] == 6
    assert photos[0].exists()


# -- mistakes: one line, exit 2, nothing written -------------------------------------------------------------
def mistakes(tmp_path: Path) -> dict[str, tuple[list, str]]:
    write_images(tmp_path / "few", 5)
    write_images(tmp_path / "flat", 12)
    write_images(tmp_path / "classes", 12, classes=CLASSES)
    (tmp_path / "empty").mkdir()
    (tmp_path / "fake.zip").write_text("not a zip archive\n")
    damaged_zip(tmp_path / "flat", tmp_path / "damaged.zip")
    return {
        "empty folder": (["--data", tmp_path / "empty"], "holds no files"),
        "fewer images than a batch": (["--data", tmp_path / "few"], "has 5 readable images, fewer than one batch of 8"),
        "a zip that is not one": (["--data", tmp_path / "fake.zip"], "fake.zip"),
        "dcgan at 128 px": (["--data", tmp_path / "flat", "--resolution", "128", "--model", "dcgan"],
                            "the dcgan family makes 28, 32 or 64 px images, not 128: use --model resnet for 128 px"),
        "resnet at 512 px": (["--data", tmp_path / "flat", "--resolution", "512"],
                             "the resnet family makes 28, 32, 64, 128 or 256 px images, not 512"),
        "conditional without labels": (["--data", tmp_path / "flat", "--conditional"],
                                       "a conditional run needs labels"),
        "class weight unconditional": (["--data", tmp_path / "classes", "--class-weight", "0.5"],
                                       "--class-weight is a setting of a class-conditional run: add --conditional"),
        "spectral norm on resnet": (["--data", tmp_path / "flat", "--model", "resnet", "--spectral-norm"],
                                    "--spectral-norm sets the dcgan family's D (resnet's is fixed)"),
        "missing data": (["--data", tmp_path / "nowhere"], "does not exist"),
        "empty data": (["--data", ""], "--data is empty: pass a folder of images"),
        "run folder in the data": (["--data", tmp_path / "flat", "--output-dir", tmp_path / "flat" / "run"],
                                   f"the run folder {tmp_path / 'flat' / 'run'} is inside the data folder"),
        "cache in the data": (["--data", tmp_path / "flat", "--cache-dir", tmp_path / "flat" / "c"],
                              f"the image cache {tmp_path / 'flat' / 'c'} is inside the data folder"),
        "damaged zip": (["--data", tmp_path / "damaged.zip"], "is a damaged ZIP archive: none of the 12 files its "
                        "central directory lists is where it says (damaged ZIP entry: Bad magic number"),
        "resume of nothing": (["--data", tmp_path / "flat", "--resume", "latest"], "checkpoint"),
    }


def damaged_zip(folder: Path, path: Path) -> None:
    """A ZIP of ``folder``'s images whose central directory points 7 bytes past every member."""
    with zipfile.ZipFile(path, "w") as archive:
        for image in sorted(folder.glob("*.png")):
            archive.write(image, image.name)
    data = bytearray(path.read_bytes())
    end = data.rfind(b"PK\x05\x06")
    size, at = struct.unpack_from("<II", data, end + 12)
    while at < end:
        offset = struct.unpack_from("<I", data, at + 42)[0]
        struct.pack_into("<I", data, at + 42, offset + 7)
        at += 46 + sum(struct.unpack_from("<HHH", data, at + 28))
    path.write_bytes(bytes(data))


def test_every_mistake_is_one_line_before_anything_is_written(tmp_path, capsys):
    for name, (flags, expected) in mistakes(tmp_path).items():
        out = tmp_path / f"run_{name.replace(' ', '_')}"
        if "--output-dir" in flags:
            out = flags[flags.index("--output-dir") + 1]
            flags = flags[:flags.index("--output-dir")]
        line = error_line(["train", *flags, "--output-dir", out, "--steps", "1", *TINY], capsys)
        assert expected in line, (name, line)
        assert not out.exists(), f"{name}: the run folder was created"


def test_a_dataset_without_the_named_image_column_is_one_line(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()  # datasets' own bars ("Generating train split") are not the command's output
    write_images(tmp_path / "pets", 12, classes=CLASSES)
    line = error_line(["train", "--data", f"hf:{tmp_path / 'pets'}", "--image-column", "picture", "--output-dir",
                       tmp_path / "run", "--steps", "1", *TINY], capsys)
    datasets.enable_progress_bars()
    assert "has no column 'picture' (its columns: image" in line and "--image-column" in line
    assert not (tmp_path / "run").exists()


def test_a_folder_holding_a_run_is_refused_before_the_data_is_read(rgb_run, tmp_path, capsys):
    _, out = rgb_run
    before = snapshot(out)
    line = error_line(["train", "--data", tmp_path / "nowhere", "--output-dir", out, *TINY], capsys)
    assert f"{out} holds a run: continue it with `--resume latest`" in line and "gan-accel never deletes a run" in line
    assert snapshot(out) == before


# -- several processes ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_gloo_processes_train_one_model_from_a_folder(tmp_path):
    write_images(tmp_path / "photos", 40, classes=CLASSES)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", GAN_ACCEL_CACHE=str(tmp_path / "cache"))
    result = subprocess.run(
        ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
         "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "gan_accel.cli", "train",
         "--data", str(tmp_path / "photos"), "--output-dir", str(out), "--conditional", "--resolution", "32",
         "--steps", "4", *TINY], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):  # both ranks trained their share: 4 steps of 8 images each
        assert f"process {rank}/2: 4 steps, 32 images in batches of 8" in result.stdout
    assert result.stdout.count("gan_accel: data:") == 1, "the data summary from the main process only"
    config = json.loads((out / "config.json").read_text())
    assert config["extra"]["num_processes"] == 2 and config["num_classes"] == 3
    assert json.loads((out / "class_names.json").read_text()) == list(CLASSES)
    assert [row["step"] for row in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert (out / "generator" / "model.safetensors").is_file() and len(list(out.glob("samples_0*.png"))) == 2


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


@pytest.mark.slow
def test_a_process_killed_during_the_cache_build_is_named_by_the_other(tmp_path):
    write_images(tmp_path / "photos", 16)
    script = tmp_path / "die.py"
    script.write_text("import os, signal, sys\nfrom gan_accel.cli import main\nfrom gan_accel.data import image_cache\n"
                      "image_cache.build_images = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
                      "sys.exit(main(sys.argv[1:]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", GAN_ACCEL_CACHE=str(tmp_path / "cache"))
    result = subprocess.run(
        ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
         "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), str(script), "train",
         "--data", str(tmp_path / "photos"), "--output-dir", str(tmp_path / "run"), "--steps", "1", *TINY],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode != 0
    assert ("gan_accel: error: process 0, building this machine's image cache, ended before it was done (killed, or "
            "out of memory?); stopping before training started") in result.stderr, result.stderr[-3000:]


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
