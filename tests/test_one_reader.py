"""Every file gan_accel reads from a run, a checkpoint, an export or a cache goes through one reader
(``gan_accel.storage.reading``): a regular file, of bounded size, opened so that a FIFO cannot hang it.

A walk of the package's source fails when a raw read (``read_text``, ``read_bytes``, ``json.load``, ``open`` for
reading, ``path.open()``, ``os.open(O_RDONLY)``, ``torch.load``, ``np.load``, safetensors' ``load_file`` /
``safe_open``, ``Image.open``) appears
outside the reader, but for the few listed below with the reason. Then real FIFOs, a link to ``/dev/zero``,
a folder and a sparse file larger than the bound stand where ``train --resume latest``, ``info`` and the
reader itself read; each is refused in one line naming the file, in seconds, never waited on.
"""

from __future__ import annotations

import ast
import os
import threading
from pathlib import Path

import pytest

from gan_accel.errors import UnsafeFileError
from gan_accel.storage import reading
from test_train_cli import TINY, error_line, gan_accel, write_images

PACKAGE = Path(__file__).resolve().parents[1] / "gan_accel"
READER = "storage/reading.py"
# Reads that are not of a run's, a checkpoint's, an export's or a cache's file, each with why it may stay.
ALLOWED = {
    ("callbacks/trackers.py", "Image.open"): "a picture this call just drew into its own temporary folder",
    ("data/image_decode.py", "Image.open"): "the user's images, on a file already opened by open_regular (bounded)",
    ("pictures/grids.py", "Image.open"): "a GIF frame: a path is opened through the reader first, a file object "
                                         "is the caller's",
    ("storage/checkpoint.py", "os.open(O_RDONLY)"): "a folder opened to fsync it: nothing is read",
}
RAW_ATTRIBUTES = {"read_text", "read_bytes", "load_file", "safe_open"}
RAW_MODULE_CALLS = {("json", "load"), ("torch", "load"), ("np", "load"), ("numpy", "load"), ("Image", "open")}


def raw_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) of each raw read in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func, name = node.func, None
        if isinstance(func, ast.Attribute):
            base = func.value.id if isinstance(func.value, ast.Name) else None
            if func.attr in RAW_ATTRIBUTES:
                name = func.attr
            elif (base, func.attr) in RAW_MODULE_CALLS:
                name = f"{base}.{func.attr}"
            elif (base, func.attr) == ("os", "open") and "O_RDONLY" in ast.dump(node):
                name = "os.open(O_RDONLY)"
            elif func.attr == "open" and base not in ("os", "Image") and _reading_mode(node.args[:1]):
                name = "Path.open"  # path.open() or path.open("rb"); a source's open(name) is the user's data
        elif isinstance(func, ast.Name) and func.id in ("load_file", "safe_open"):
            name = func.id
        elif isinstance(func, ast.Name) and func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"),
                                                                 ast.Constant("r"))
            writes = isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
            name = None if writes else "open"
        if name:
            found.append((node.lineno, name))
    return found


def _reading_mode(args: list) -> bool:
    """Whether the positional arguments of a ``.open(...)`` call say a mode that reads (none: "r")."""
    if not args:
        return True
    return isinstance(args[0], ast.Constant) and isinstance(args[0].value, str) and \
        args[0].value.strip("rbt") == ""


def test_the_walk_finds_each_kind_of_raw_read():
    source = ("import json, torch, numpy as np\nfrom PIL import Image\nfrom safetensors.torch import load_file\n"
              "p.read_text()\np.read_bytes()\njson.load(f)\ntorch.load(p)\nnp.load(p)\nImage.open(p)\n"
              "load_file(p)\nsafe_open(p, 'pt')\nopen(p)\nopen(p, 'rb')\nopen(p, 'wb')\nopen(p, mode='ab')\n"
              "p.open()\np.open('rb')\np.open('w')\nsource.open(name)\nos.open(p, os.O_RDONLY)\n"
              "os.open(p, os.O_WRONLY)\n")
    assert [name for _, name in raw_reads(source)] == ["read_text", "read_bytes", "json.load", "torch.load",
                                                        "np.load", "Image.open", "load_file", "safe_open", "open",
                                                        "open", "Path.open", "Path.open", "os.open(O_RDONLY)"]


def test_no_raw_read_of_a_file_outside_the_one_reader():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == READER:
            continue
        found += [f"{module}:{line}: {name}" for line, name in raw_reads(path.read_text())
                  if (module, name) not in ALLOWED]
    assert not found, ("read these through gan_accel.storage.reading (or list them in ALLOWED with the reason): "
                       + "; ".join(found))


def test_the_allowed_reads_are_still_there():
    """An entry that no longer matches anything is dropped from the list, not left to excuse a new read."""
    for module, name in ALLOWED:
        assert name in [n for _, n in raw_reads((PACKAGE / module).read_text())], (module, name)


# -- the reader itself ---------------------------------------------------------------------------------------
def returns_in_time(call, seconds: float = 20):
    """``call()``'s result or error, failing the test when it does not return within ``seconds``."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the reader waited on the file"
    return outcome[0]


def odd_files(folder: Path) -> dict[str, tuple[Path, str]]:
    """A FIFO, a link to a device, a folder and a sparse file beyond the JSON bound: (path, what the line says)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "fifo.json")
    (folder / "zero.json").symlink_to("/dev/zero")
    (folder / "folder.json").mkdir()
    with open(folder / "huge.json", "wb") as handle:
        handle.truncate(reading.MAX_JSON_BYTES + 1)  # sparse: nothing is written
    return {"fifo": (folder / "fifo.json", "a FIFO"), "device": (folder / "zero.json", "a character device"),
            "folder": (folder / "folder.json", "a folder"), "huge": (folder / "huge.json", "too large")}


def test_the_reader_refuses_what_is_not_a_bounded_regular_file(tmp_path):
    for kind, (path, says) in odd_files(tmp_path).items():
        error = returns_in_time(lambda: reading.read_json(path))
        assert isinstance(error, UnsafeFileError), (kind, error)
        assert str(path) in str(error) and says in str(error) and "\n" not in str(error), str(error)
    (tmp_path / "real.json").write_text('{"a": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    assert reading.read_json(tmp_path / "link.json") == {"a": 1}, "a link to a regular file is read as that file"
    with pytest.raises(FileNotFoundError):
        reading.read_json(tmp_path / "absent.json")


def test_checked_library_reads_refuse_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors")
    for read in (reading.load_safetensors, reading.load_array, reading.load_weights_only):
        error = returns_in_time(lambda: read(tmp_path / "model.safetensors"))
        assert isinstance(error, UnsafeFileError) and "not a regular file" in str(error), (read, error)


# -- the resume path, and info -------------------------------------------------------------------------------
@pytest.fixture
def image_run(tmp_path, monkeypatch):
    monkeypatch.setenv("GAN_ACCEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_images(tmp_path / "photos", 16)
    out = tmp_path / "run"
    base = ["train", "--data", tmp_path / "photos", "--output-dir", out, *TINY]
    return out, base


@pytest.mark.parametrize("name", ["data.json", "config.json"])
def test_train_resume_latest_refuses_an_odd_run_file_in_one_line(image_run, capsys, name, tmp_path):
    out, base = image_run
    code, _, err = gan_accel([*base, "--steps", "2"], capsys)
    assert code == 0, err[-2000:]
    saved = (out / name).read_bytes()
    for kind, (odd, says) in odd_files(tmp_path / "odd").items():
        (out / name).unlink()
        if kind == "device":
            (out / name).symlink_to("/dev/zero")
        else:
            os.rename(odd, out / name)
        line = returns_in_time(lambda: error_line([*base, "--steps", "4", "--resume", "latest"], capsys))
        assert isinstance(line, str), line
        assert str(out / name) in line and says in line, (kind, line)
        if (out / name).is_dir() and not (out / name).is_symlink():
            (out / name).rmdir()
        else:
            (out / name).unlink()
        (out / name).write_bytes(saved)
    code, _, err = gan_accel([*base, "--steps", "4", "--resume", "latest"], capsys)
    assert code == 0, err[-2000:]


def test_info_is_not_held_up_by_a_fifo_lock(image_run, capsys):
    out, base = image_run
    assert gan_accel([*base, "--steps", "2"], capsys)[0] == 0
    (out / ".lock").unlink()
    os.mkfifo(out / ".lock")
    code, stdout, _ = returns_in_time(lambda: gan_accel(["info", out], capsys))
    assert code == 0 and ": finished" in stdout
