"""benchmarks/make_rgb_digits.py makes what it says, and benchmarks/image_data.py --quick prints every table.

Only the shape of the benchmark's report is checked, never its numbers (timings belong in the README).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import image_data
        import make_rgb_digits
    finally:
        sys.path.remove(str(BENCHMARKS))
    return make_rgb_digits, image_data


def test_rgb_digits_are_deterministic_coloured_pngs_in_class_folders(bench, tmp_path: Path) -> None:
    make, _ = bench
    # No MNIST in this folder: the offline digits stand in (the source is named in what is returned).
    made = make.make_rgb_digits(tmp_path / "a", num=40, size=32, seed=3, corrupt_fraction=0.1,
                                zip_path=tmp_path / "a.zip", mnist_dir=str(tmp_path / "no_mnist"))
    make.make_rgb_digits(tmp_path / "b", num=40, size=32, seed=3, corrupt_fraction=0.1,
                                 mnist_dir=str(tmp_path / "no_mnist"))
    assert "offline digits" in made["source"]
    files = sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*.png"))
    assert len(files) == 40 and {f.split("/")[0] for f in files} == {str(d) for d in range(10)}
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    broken = {Path(p).relative_to(tmp_path / "a").as_posix() for p in made["corrupt"]}
    assert len(broken) == 4
    for name in files:
        index = int(Path(name).stem)
        assert name.split("/")[0] == str(int(made["labels"][index]))  # the folder is the digit's class
        try:
            with Image.open(tmp_path / "a" / name) as img:
                img.load()
                pixels = np.asarray(img)
        except (OSError, SyntaxError, ValueError):
            assert name in broken
            continue
        assert name not in broken and img.mode == "RGB" and pixels.shape == (32, 32, 3)
        assert np.abs(pixels[..., 0].astype(int) - pixels[..., 2]).max() > 30  # coloured, not grey
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        assert sorted(archive.namelist()) == files


@pytest.mark.slow  # fresh DataLoader workers, a dozen GANTrainer steps: about 30-60 s on a busy 2-core machine
def test_quick_image_benchmark_prints_every_table(bench, capsys) -> None:
    _, image_data = bench
    assert image_data.main(["--quick", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "| data path at 64 px | images/s |" in out
    for row in ("cache build", "cache hit", "decode per item, 0 DataLoader workers", "decode per item, 2 DataLoader",
                "from the ZIP", "imagefolder", "memory-mapped cache"):
        assert row in out, row
    assert "cached / best per-item decode:" in out
    assert "| data wait share of a step |" in out and out.count("% | ") >= 2
    broken = int(out.split("| files broken by the generator | ")[1].split(" ")[0].replace(",", ""))
    skipped = int(out.split("| files skipped by the scan and build | ")[1].split(" ")[0].replace(",", ""))
    assert broken == skipped > 0
    assert "gan_accel: warning: skipped" in out
