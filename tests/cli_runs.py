"""Tiny runs and the in-process command for the ``gan-accel`` command tests (tests/test_cli.py,
tests/test_cli_info.py, and other tests that train a run and read it through the command).

``train`` makes a tiny DCGAN (or conditional DCGAN) run on 28x28 noise images, checkpoints every 2 steps;
``ema_run`` and ``cond_run`` are the module-scoped runs tests/test_cli.py shares (trained once per module
that imports them: tests/test_cli.py alone); ``cli`` runs ``gan-accel`` in this process; ``error_line`` is its
one ``error:`` line (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import NUM_CLASSES, make_images, make_labels, make_loader, reset_accelerate_state
from gan_accel import GANTrainer, TrainConfig
from gan_accel.callbacks import Evaluator
from gan_accel.cli import main
from gan_accel.eval import compute_features
from gan_accel.models import ConditionalDCGANGenerator, DCGANDiscriminator, DCGANGenerator, ProjectionDiscriminator

Z = 8
MODEL = {"family": "dcgan", "z_dim": Z, "width": 4, "image_size": 28, "channels": 1, "num_classes": None}
CK2, CK4 = "checkpoint_00000002", "checkpoint_00000004"


def pixels(x: torch.Tensor) -> torch.Tensor:  # a stand-in feature extractor: 4 numbers per image
    return torch.nn.functional.avg_pool2d(x.float(), 14).flatten(1)


def train(out: Path, steps: int = 4, ema: float | None = 0.5, conditional: bool = False, callbacks=(),
          resume_from=None) -> GANTrainer:
    """A tiny DCGAN (or conditional DCGAN) run on 28x28 noise images: checkpoints every 2 steps."""
    reset_accelerate_state()
    images = make_images(64).float().repeat(1, 1, 7, 7)
    torch.manual_seed(0)
    if conditional:
        G, D = ConditionalDCGANGenerator(NUM_CLASSES, z_dim=Z, width=4), ProjectionDiscriminator(NUM_CLASSES, width=4)
        loader = DataLoader(TensorDataset(images, make_labels(64)), batch_size=8, drop_last=True)
    else:
        G, D = DCGANGenerator(Z, 4), DCGANDiscriminator(4)
        loader = make_loader(images, 8)
    model = {**MODEL, "num_classes": NUM_CLASSES} if conditional else MODEL
    cfg = TrainConfig(max_steps=steps, batch_size=8, z_dim=Z, ema_decay=ema, num_classes=NUM_CLASSES if conditional else None,
                      log_every=1, sample_every=100, checkpoint_every=2, keep_checkpoints=3, num_samples=6,
                      output_dir=str(out), progress_bar=False, model=model, extra={"dataset": "test-noise"})
    trainer = GANTrainer(G, D, loader, cfg, callbacks=list(callbacks))
    trainer.fit(resume_from=resume_from)
    reset_accelerate_state()
    return trainer


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """An unconditional run with an EMA, an evaluation callback (best.json) and an eval.json."""
    out = tmp_path_factory.mktemp("cli") / "ema"
    images = make_images(64).float().repeat(1, 1, 7, 7)
    evaluator = Evaluator(pixels, compute_features(pixels, images), every=2, num_samples=16, metric="fd")
    trainer = train(out, callbacks=[evaluator])
    evaluation = {"fd": 12.5, "kid": 0.25, "summary": "evaluation against test noise\n  Frechet distance: 12.500"}
    (out / "eval.json").write_text(json.dumps(evaluation, indent=2) + "\n")
    return out, trainer


@pytest.fixture(scope="module")
def cond_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "cond"
    return out, train(out, conditional=True)


def cli(argv, capsys) -> tuple[int, str, str]:
    """Run ``gan-accel`` in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse: --help, usage errors
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(argv, capsys) -> str:
    code, out, err = cli(argv, capsys)
    assert code == 2, (out, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def the_same_latents(num: int, seed: int) -> torch.Tensor:
    return torch.randn(num, Z, generator=torch.Generator().manual_seed(seed))


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}
