"""Hostile or careless inputs found by a red team on the own-images surface, each pinned to its one line or
its right result: a ZIP that stores a name twice, ``--data hf:``, a run folder given as data, float images."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gan_accel.data import scan_images
from gan_accel.data.image_decode import to_working_mode
from gan_accel.data.image_sources import ZipSource
from gan_accel.errors import DataError
from test_train_cli import error_line, write_images


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (value, 0, 0)).save(buffer, "PNG")
    return buffer.getvalue()


def test_a_zip_that_stores_a_name_twice_gives_its_last_copy_once(tmp_path: Path) -> None:
    archive = tmp_path / "appended.zip"
    with zipfile.ZipFile(archive, "w") as zipped, pytest.warns(UserWarning, match="Duplicate name"):
        zipped.writestr("a.png", _png(10))
        zipped.writestr("b.png", _png(20))
        zipped.writestr("a.png", _png(30))  # appended later: what unzip extracts
    source = ZipSource(archive)
    assert [entry.name for entry in source.entries()] == ["a.png", "b.png"]
    assert np.asarray(Image.open(source.open("a.png")))[0, 0, 0] == 30


def test_hf_without_a_name_is_refused_as_such_not_as_the_current_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    line = error_line(["train", "--data", "hf:", "--output-dir", tmp_path / "run"], capsys)
    assert line == "error: 'hf:' names no dataset: write hf:NAME[:SPLIT] (a Hub dataset) or hf:FOLDER[:SPLIT]"


def _run_folder(root: Path) -> Path:
    write_images(root, 6)  # the run's grids and plots, as far as a scan can tell
    (root / "history.jsonl").write_text('{"event": "start"}\n')
    (root / "data.json").write_text(json.dumps({"source": "photos\x1b[31m"}))
    return root


def test_a_run_folder_or_its_checkpoint_is_refused_as_data(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "run")
    checkpoint = run / "checkpoints" / "checkpoint_00000002"
    write_images(checkpoint, 4)
    with pytest.raises(DataError) as error:
        scan_images(run, cache_dir=tmp_path / "cache")
    assert str(error.value) == (f"{run} is a gan_accel run folder, not a folder of training images (its images are "
                                "the run's sample grids and plots): pass the images the run trained on (data.json "
                                "names photos\\x1b[31m)")
    with pytest.raises(DataError, match="is a gan_accel run folder"):
        scan_images(checkpoint, cache_dir=tmp_path / "cache")


def test_images_in_folders_named_like_a_runs_are_still_data(tmp_path: Path) -> None:
    write_images(tmp_path / "photos" / "generator", 4)  # a class of pictures of generators, say
    write_images(tmp_path / "photos" / "checkpoints", 4)
    assert len(scan_images(tmp_path / "photos", cache_dir=tmp_path / "cache").entries) == 8


def test_float_grey_in_0_to_1_reads_like_its_8_bit_image() -> None:
    grey = np.random.default_rng(0).integers(0, 256, (6, 5), dtype=np.uint8)
    for scale in (255.0, 1.0):  # 0..255 floats and 0..1 floats
        floats = Image.fromarray((grey / 255.0 * scale).astype(np.float32), mode="F")
        assert np.array_equal(np.asarray(to_working_mode(floats, 3, 255)), grey), scale


def test_a_link_loop_is_skipped_as_unreadable_not_as_a_corrupt_image(tmp_path: Path) -> None:
    from gan_accel.data.image_scan import skip_reason
    from gan_accel.data.image_sources import FolderSource

    (tmp_path / "self.png").symlink_to("self.png")
    with pytest.raises(OSError) as error:
        FolderSource(tmp_path).open("self.png")
    assert skip_reason(error.value) == "unreadable: Too many levels of symbolic links"
    write_images(tmp_path / "whole", 1)
    whole = (tmp_path / "whole" / "0000.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(OSError) as error:
        Image.open(tmp_path / "cut.png").load()
    assert skip_reason(error.value).startswith("truncated or corrupt: ")  # Pillow's, not the system's


def test_a_cache_folder_that_is_a_file_is_one_error_without_a_warning_before_it(tmp_path: Path) -> None:
    from gan_accel.data.image_cache import CacheFolder

    (tmp_path / "afile").write_text("")
    said: list[str] = []
    assert CacheFolder(tmp_path / "afile", "0" * 64).read_json(tmp_path / "afile" / "x" / "scan.json", said.append) is None
    assert said == []


def test_file_names_that_are_not_utf_8_are_scanned_not_a_traceback(tmp_path: Path) -> None:
    import os

    photos = tmp_path / "photos"
    write_images(photos, 3)
    os.rename(photos / "0000.png", os.fsencode(photos) + b"/latin-1 \xe9t\xe9.png")  # as old archives unpack
    scan = scan_images(photos, cache_dir=tmp_path / "cache")
    assert sorted(entry.name for entry in scan.entries) == ["0001.png", "0002.png", "latin-1 \udce9t\udce9.png"]


def test_export_weights_linked_out_of_their_folder_are_refused(tmp_path):
    """A generator's model.safetensors that links to a file elsewhere is refused in one line, never followed."""
    import shutil

    from gan_accel import load_generator
    from gan_accel.errors import GanAccelError
    from gan_accel.models import build_generator
    from gan_accel.storage.weights import generator_config, save_generator

    spec = {"family": "dcgan", "z_dim": 8, "width": 4, "image_size": 28, "channels": 1, "num_classes": None}
    folder = tmp_path / "gen"
    save_generator(folder, build_generator(spec), generator_config({"model": spec}, 1, False, False, tmp_path))
    load_generator(folder)  # the folder as written loads
    elsewhere = tmp_path / "elsewhere.safetensors"
    shutil.move(folder / "model.safetensors", elsewhere)
    (folder / "model.safetensors").symlink_to(elsewhere)
    with pytest.raises(GanAccelError, match="out of its folder"):
        load_generator(folder)


def test_zip_members_with_paths_out_of_the_archive_are_listed_as_skipped(tmp_path):
    import io
    import zipfile

    from PIL import Image

    from gan_accel.data import open_image_data

    png = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(png, "PNG")
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as archive:
        for i in range(8):
            archive.writestr(f"img/{i}.png", png.getvalue())
        archive.writestr("../../etc/x.png", png.getvalue())
        archive.writestr("/abs/y.png", png.getvalue())
    data = open_image_data(tmp_path / "a.zip", resolution=32, cache_dir=tmp_path / "cache", log=None)
    assert len(data) == 8
    reasons = {s.name: s.reason for s in data.report.skipped}
    assert set(reasons) == {"../../etc/x.png", "/abs/y.png"}
    assert all(r.startswith("a member path out of the archive") for r in reasons.values())


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc: a folder no one can create files in")
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    """``--out`` is tried with a real write when the command starts (os.access says yes to root anywhere), so an
    evaluation or a sampling run is not done for nothing; the probe leaves nothing behind."""
    from gan_accel.cli.common import check_new_output
    from gan_accel.errors import GanAccelError

    with pytest.raises(GanAccelError, match=r"--out /proc/scores.json: cannot write it"):
        check_new_output(Path("/proc/scores.json"))
    check_new_output(tmp_path / "scores.json")
    assert list(tmp_path.iterdir()) == []


# -- round three's red team -----------------------------------------------------------------------------------
def test_accumulation_a_stop_could_never_reach_is_refused_in_one_line(tmp_path, capsys):
    """A step is never cut short (a stop is acted on between steps): --grad-accum 10**12 was a run that one SIGTERM
    could not end. 4,096 micro-batches per step is the most, counted with n_critic."""
    from gan_accel import TrainConfig
    from gan_accel.errors import ConfigError

    TrainConfig(grad_accum_steps=4096, n_critic=1)
    with pytest.raises(ConfigError, match=r"draws 4,098 micro-batches per step, more than the 4,096 allowed"):
        TrainConfig(grad_accum_steps=2049, n_critic=2)
    line = error_line(["train", "--data", tmp_path, "--grad-accum", "1000000000000"], capsys)
    assert line.startswith("error: argument --grad-accum: '1000000000000' is more than 4,096, the largest allowed")


@pytest.mark.parametrize("marker", [b"garbage", b"[1, 2]"])
def test_a_damaged_complete_marker_is_named_before_a_resume_loads_anything(tmp_path, marker):
    """A COMPLETE that is not a JSON object used to resume without its checks (processes, config, run id)."""
    from gan_accel.config import TrainConfig
    from gan_accel.engine.run_open import choose_checkpoint
    from gan_accel.errors import CheckpointError

    for step, text in ((2, b"{}"), (4, marker)):
        folder = tmp_path / "run" / "checkpoints" / f"checkpoint_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "COMPLETE").write_bytes(text)
    damaged = tmp_path / "run" / "checkpoints" / "checkpoint_00000004" / "COMPLETE"
    with pytest.raises(CheckpointError) as error:
        choose_checkpoint("latest", TrainConfig(output_dir=str(tmp_path / "run")))
    assert str(error.value).startswith(f"{damaged} is damaged (") and "complete ones: checkpoint_00000002" in \
        str(error.value)


def test_the_api_names_a_wrong_type_or_a_missing_device_in_one_line(tmp_path):
    import torch
    from torch.utils.data import DataLoader

    from gan_accel import GANTrainer, TrainConfig, load_generator
    from gan_accel.errors import ConfigError, PreflightError
    from gan_accel.models import build_generator
    from gan_accel.storage.weights import generator_config, save_generator

    with pytest.raises(TypeError, match=r"^load_generator takes a folder's path or a Hub repo id .*not int$"):
        load_generator(123)
    spec = {"family": "dcgan", "z_dim": 8, "width": 4, "image_size": 28, "channels": 1, "num_classes": None}
    save_generator(tmp_path / "gen", build_generator(spec), generator_config({"model": spec}, 1, False, False, tmp_path))
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last CUDA device this machine has
    with pytest.raises(ConfigError, match=rf"device='{missing}': this machine has \d+ CUDA device\(s\)"):
        load_generator(tmp_path / "gen", device=missing)
    with pytest.raises(ConfigError, match="is not a device torch knows"):
        load_generator(tmp_path / "gen", device="gpu")
    with pytest.raises(PreflightError, match="^G is a NoneType, not a torch.nn.Module: pass the network itself$"):
        GANTrainer(None, torch.nn.Linear(4, 1), DataLoader(torch.randn(8, 4), batch_size=4),
                   TrainConfig(batch_size=4, z_dim=4, output_dir=str(tmp_path / "run")))


def test_a_license_that_is_not_an_id_never_reaches_the_cards_yaml(tmp_path):
    from gan_accel.errors import ConfigError
    from gan_accel.hub.card import check_license
    from gan_accel.hub.export import export_generator

    for good in ("apache-2.0", "cc-by-nc-sa-4.0", "other", None):
        check_license(good)
    with pytest.raises(ConfigError, match=r"^--license 'mit\\n# <script>' is not a license id"):
        export_generator(tmp_path / "nothing-read-first", tmp_path / "out", license="mit\n# <script>")
    assert not (tmp_path / "out").exists()


def test_info_notes_a_history_that_is_a_fifo_and_a_config_that_is_not_an_object(tmp_path, capsys):
    import os

    from test_train_cli import gan_accel

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("[1, 2]")
    os.mkfifo(run / "history.jsonl")
    code, out, _ = gan_accel(["info", run], capsys)
    assert code == 0
    assert "note: history.jsonl is not a regular file (a FIFO, device, folder or dangling link): not read" in out
    assert "note: config.json is not a JSON object: the config shown is the export's or the latest checkpoint's" in out
