"""``gan-accel train`` on your own images: a folder (RGB, grayscale, class folders), a ZIP and a Hugging Face
imagefolder train the model that fits them, the run folder keeps the data's files and the networks' spec,
``gan-accel sample --label`` takes a class name or its index, a resume continues and refuses data that changed
under it, and every mistake is one ``error:`` line (exit 2) with nothing written. The slow tests launch the
command on two gloo processes (one trains, one is killed during the cache build).

Checked against independent computations: the model spec against the registry's ``default_spec``, the
default resolution against the images' sizes, the fingerprint against ``open_image_data``, the samples of a
class name against those of its index, the data's files against what the images are.

The data's names and class labels, grids of many classes, the held-out slice and the evaluation's feature
space are in tests/test_train_cli_data.py. Other test files import this file's helpers (``gan_accel``,
``error_line``, ``write_images``, ``TINY``, ...).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
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
