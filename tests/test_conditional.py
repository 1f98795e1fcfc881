"""Conditional runs: labels checked before training, one grid row per class, sampling a chosen class.

(The update rules with labels, accumulation, 2 processes and resume are proven with the others in
test_engine.py, test_distributed.py and test_resume.py.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

from conftest import NUM_CLASSES, Z_DIM, make_images, make_labels, make_loader, make_models, reset_accelerate_state
from gan_accel import GANTrainer, PreflightError, TrainConfig
from gan_accel.config import compare_configs
from gan_accel.models import ConditionalDCGANGenerator, ProjectionDiscriminator
from gan_accel.storage.run_folder import read_fixed_latents


def config(tmp_path, **overrides) -> TrainConfig:
    cfg = dict(max_steps=4, batch_size=4, z_dim=Z_DIM, num_classes=NUM_CLASSES, log_every=2, sample_every=2,
               num_samples=7, output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def trainer_with(tmp_path, labels=None, loader=None, models=None, **overrides) -> GANTrainer:
    G, D = models or make_models(conditional=True)
    images = make_images(32)
    if loader is None:
        loader = make_loader(images, 4, make_labels(32) if labels is None else labels)
    return GANTrainer(G, D, loader, config(tmp_path, **overrides))


# -- preflight -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case, says", [
    ("no labels", r"conditional \(num_classes=3\) but the batches carry no labels"),
    ("float labels", r"must be integer class indices of shape \(N,\), got torch.float32"),
    ("one-hot", r"must be integer class indices of shape \(N,\), got torch.int64 \(2, 3\).*argmax"),
    ("out of range", r"hold class 3, outside \[0, 3\) for num_classes=3"),
    ("negative", r"hold class -1, outside \[0, 3\)"),
    ("G without labels", r"G\(latents, labels\) \(a conditional run: G must take the labels"),
    ("D without labels", r"D\(x, labels\) \(a conditional run: D must take the labels"),
])
def test_bad_labels_and_models_are_refused_before_training(tmp_path, case, says):
    images = make_images(32)
    labels = make_labels(32)
    models, loader = None, None
    if case == "no labels":
        loader = make_loader(images, 4)
    elif case == "float labels":
        loader = DataLoader(TensorDataset(images, labels.float()), batch_size=4)
    elif case == "one-hot":
        loader = DataLoader(TensorDataset(images, torch.nn.functional.one_hot(labels, 3)), batch_size=4)
    elif case == "out of range":
        loader = make_loader(images, 4, torch.full((32,), 3))
    elif case == "negative":
        loader = make_loader(images, 4, torch.full((32,), -1))
    elif case == "G without labels":
        models = (make_models()[0], make_models(conditional=True)[1])
    else:
        models = (make_models(conditional=True)[0], make_models()[1])
    with pytest.raises(PreflightError, match=says):
        trainer_with(tmp_path, loader=loader, models=models)
    assert not (tmp_path / "run").exists()


def test_dict_batches_with_a_label_key_and_a_custom_label_sampler(tmp_path):
    images, labels = make_images(32), make_labels(32)

    class Dicts(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return {"pixel_values": images[i], "class_labels": labels[i]}

    asked = []

    def only_class_two(batch_size, device):
        asked.append(batch_size)
        return torch.full((batch_size,), 2, device=device)

    G, D = make_models(conditional=True)
    trainer = GANTrainer(G, D, DataLoader(Dicts(), batch_size=4, drop_last=True), config(tmp_path),
                         label_sampler=only_class_two)
    trainer.fit()
    assert asked[0] == 2 and set(asked[1:]) == {4}  # the preflight's 2-sample batch, then every micro-batch


def test_an_unconditional_run_ignores_labels_and_refuses_a_label_sampler(tmp_path):
    G, D = make_models(dtype=torch.float32)
    images = make_images(32, dtype=torch.float32)
    trainer = GANTrainer(G, D, make_loader(images, 4, make_labels(32)), config(tmp_path, num_classes=None))
    trainer.fit()  # (images, labels) pairs train an unconditional GAN as before
    with pytest.raises(ValueError, match="label_sampler is given but config.num_classes is None"):
        GANTrainer(*make_models(dtype=torch.float32), make_loader(images, 4), config(tmp_path / 'other', num_classes=None),
                   label_sampler=lambda n, d: torch.zeros(n, dtype=torch.long))


# -- progress grids ----------------------------------------------------------------------------------
def test_grids_have_one_row_per_class_from_fixed_labels_saved_with_the_run(tmp_path):
    trainer = trainer_with(tmp_path)  # num_samples=7, 3 classes: 2 columns, 3 rows
    trainer.fit()
    out = tmp_path / "run"
    fixed_latents, fixed_labels = read_fixed_latents(out)
    assert torch.equal(fixed_labels, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert fixed_latents.shape == (6, Z_DIM)
    grid = Image.open(out / "samples_000002.png")
    # torchvision's grid: padding 2 around 4x4 images -> 2 columns = 14 px wide, 3 rows = 20 px high
    assert grid.size == (2 * (4 + 2) + 2, 3 * (4 + 2) + 2)
    # The grid's rows are G's samples of class 0, 1, 2 from the fixed latents.
    expected = trainer.generate(trainer.fixed_latents, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert torch.equal(trainer.generate(), expected)
    with pytest.raises(ValueError, match="pass labels"):
        trainer.generate(trainer.fixed_latents)


def test_labels_and_label_distribution_cannot_change_on_resume():
    saved = TrainConfig(num_classes=10).to_dict()
    refused, _ = compare_configs(saved, TrainConfig(num_classes=None).to_dict())
    assert refused == ["num_classes: 10 -> None"]
    refused, _ = compare_configs(saved, TrainConfig(num_classes=10, label_distribution="data").to_dict())
    assert refused == ["label_distribution: 'uniform' -> 'data'"]
    # A checkpoint from before a field existed resumes when the field is left at its default.
    older = {k: v for k, v in saved.items() if k != "label_distribution"}
    assert compare_configs(older, TrainConfig(num_classes=10).to_dict()) == ([], {})


# -- reference models --------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [28, 32, 64])
@pytest.mark.parametrize("spectral_norm", [False, True])
@pytest.mark.parametrize("position", ["coords", "moments", "none"])
def test_reference_conditional_models_for_every_size(size, spectral_norm, position):
    G = ConditionalDCGANGenerator(10, z_dim=8, width=4, image_size=size, channels=3)
    D = ProjectionDiscriminator(10, width=4, image_size=size, channels=3, spectral_norm=spectral_norm,
                                position=position)
    y = torch.tensor([0, 3, 9])
    x = G(torch.randn(3, 8), y)
    assert x.shape == (3, 3, size, size) and x.abs().max() <= 1
    logits = D(x, y)
    assert logits.shape == (3,)
    # The projection term: the same image judged as another class gets another logit.
    assert not torch.allclose(D(x, y), D(x, (y + 1) % 10))
    if spectral_norm:  # the largest singular value of each normalised weight is 1 (after a few power steps)
        D.train()
        for _ in range(20):
            D(x.detach(), y)
        weight = D.psi.weight
        assert torch.linalg.matrix_norm(weight, ord=2).item() == pytest.approx(1.0, abs=1e-3)


def test_projection_discriminator_sees_where_a_digit_sits():
    """Why D gets a ``position``: with features only averaged over space, D gives a digit shifted by a
    whole feature cell the same logit (G drew thin digits off-centre unnoticed); with coordinate
    channels or spatial moments, D tells the two apart."""
    torch.manual_seed(0)
    x = torch.full((2, 1, 28, 28), -1.0)
    x[:, :, 8:20, 11:13] = 1.0  # a thin vertical stroke, away from the borders
    shifted = torch.roll(x, shifts=-4, dims=3)  # 4 px = one cell of the 7x7 feature map (two stride-2 stages)
    y = torch.tensor([1, 1])
    for position, same in (("none", True), ("coords", False), ("moments", False)):
        torch.manual_seed(0)
        D = ProjectionDiscriminator(10, width=8, position=position).eval()
        with torch.no_grad():
            torch.nn.init.normal_(D.embed.weight)  # a projection of the scale a trained D has
            moved = D(x, y) - D(shifted, y)
        assert bool(moved.abs().max() < 1e-5) == same, (position, moved)
    with pytest.raises(ValueError, match="position='frame' is not supported: choose one of coords, moments, none"):
        ProjectionDiscriminator(10, position="frame")


# -- sampling a chosen class -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_conditional_run(tmp_path_factory):
    """A tiny run of the conditional example's model family, with an EMA and a checkpoint."""
    reset_accelerate_state()
    out = tmp_path_factory.mktemp("cond") / "run"
    images = make_images(64).float().repeat(1, 1, 7, 7)  # 28x28
    labels = make_labels(64)
    G = ConditionalDCGANGenerator(NUM_CLASSES, z_dim=8, width=4)
    D = ProjectionDiscriminator(NUM_CLASSES, width=4)
    cfg = TrainConfig(max_steps=4, batch_size=8, z_dim=8, num_classes=NUM_CLASSES, ema_decay=0.5, num_samples=6,
                      sample_every=2, checkpoint_every=2, output_dir=str(out), progress_bar=False,
                      model={"family": "dcgan", "z_dim": 8, "width": 4, "image_size": 28, "channels": 1,
                             "num_classes": NUM_CLASSES})
    trainer = GANTrainer(G, D, DataLoader(TensorDataset(images, labels), batch_size=8, drop_last=True), cfg)
    trainer.fit()
    reset_accelerate_state()
    return out, trainer


def test_sample_a_chosen_class_from_the_run_and_from_a_checkpoint_as_the_run_does(finished_conditional_run):
    from gan_accel import load_generator
    from gan_accel.sampling import sample_images

    out, trainer = finished_conditional_run
    G = load_generator(out)
    assert G.num_classes == NUM_CLASSES and G.info["weights"]["step"] == 4
    images, labels = sample_images(G, num=5, label=2, seed=3)
    assert images.shape == (5, 1, 28, 28) and labels.tolist() == [2] * 5
    # The same latents and labels through the trainer's own sampling generator (the EMA) agree.
    z = torch.randn(5, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(images, trainer.sampling_generator().eval()(z, torch.full((5,), 2)))
    # A checkpoint's G is the EMA of that step: at the last step, the same weights as the export.
    G_ckpt = load_generator(out / "checkpoints" / "checkpoint_00000004")
    assert G_ckpt.info["weights"]["step"] == 4
    assert all(torch.equal(a, b) for a, b in zip(G.state_dict().values(), G_ckpt.state_dict().values()))
    from gan_accel.errors import ConfigError

    with pytest.raises(ConfigError, match="label 3 is outside the run's classes 0..2"):
        sample_images(G, num=2, label=3)


def test_gan_accel_sample_label_png_and_npz(finished_conditional_run, tmp_path, capsys):
    from gan_accel.cli import main

    out, _ = finished_conditional_run
    assert main(["sample", str(out), "--label", "1", "--num", "6", "--out", str(tmp_path / "ones.png")]) == 0
    assert Image.open(tmp_path / "ones.png").size == (6 * (28 + 2) + 2, 28 + 4)  # 6 in one row (rows of 10)
    assert main(["sample", str(out / "checkpoints" / "checkpoint_00000002"), "--format", "npz", "--num", "6",
                 "--out", str(tmp_path / "all.npz")]) == 0
    arrays = np.load(tmp_path / "all.npz")
    assert arrays["images"].shape == (6, 1, 28, 28) and arrays["labels"].tolist() == [0, 0, 1, 1, 2, 2]
    assert main(["sample", str(out), "--label", "7", "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: label 7 is outside the run's classes 0..2"


def test_gan_accel_sample_label_on_an_unconditional_run_is_one_line(tmp_path, capsys):
    from gan_accel.cli import main
    from gan_accel.models import DCGANDiscriminator, DCGANGenerator

    images = make_images(64).float().repeat(1, 1, 7, 7)
    cfg = TrainConfig(max_steps=2, batch_size=8, z_dim=8, output_dir=str(tmp_path / "run"), progress_bar=False,
                      model={"family": "dcgan", "z_dim": 8, "width": 4, "image_size": 28, "channels": 1, "num_classes": None})
    GANTrainer(DCGANGenerator(8, 4), DCGANDiscriminator(4), make_loader(images, 8), cfg).fit()
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "run"), "--label", "1", "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: this run is unconditional (no num_classes): it cannot sample a chosen class; leave out "
                   "the label"]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["num_classes"] is None


def test_within_class_stddev_against_a_loop():
    from gan_accel.models.conditional import within_class_stddev

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(9, 5, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1, 1, 2, 2, 2, 0, 1, 3])  # class 3 has one sample, class 4 none
    total, count = 0.0, 0
    for i in range(9):
        same = features[labels == labels[i]]
        total += float(((features[i] - same.mean(0)) ** 2).sum())
        count += features.shape[1]
    assert within_class_stddev(features, labels, 5).item() == pytest.approx((total / count + 1e-8) ** 0.5, rel=1e-12)
    # A batch collapsed within each class (every class one image) scores ~0, whatever varies across classes.
    collapsed = features[labels]  # row i = features[label_i]: identical within a class
    assert within_class_stddev(collapsed, labels, 5).item() == pytest.approx(1e-4)


def test_conditional_evaluation_counts_agreement_per_requested_class(monkeypatch):
    """A judge that reads the digit from an image's brightness, and a G that draws digit c when asked for c,
    except for digit 1, where every other sample is a 2: agreement 50% for 1, 100% elsewhere."""
    import types

    import gan_accel.eval.mnist as mnist_eval

    def code(c):
        return (c + 0.5) / 10 * 2 - 1

    class Judge(torch.nn.Module):
        num_classes = 10

        def __init__(self):
            super().__init__()
            self.features = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 1))
            with torch.no_grad():
                self.features[1].weight.fill_(1 / 784)
                self.features[1].bias.zero_()
            self.head = _Nearest(torch.tensor([code(c) for c in range(10)]))

        def forward(self, x):
            return self.head(self.features(x))

    class OneTwoG(torch.nn.Module):
        def forward(self, z, y):
            digits = y.clone()
            ones = (y == 1).nonzero().flatten()
            digits[ones[::2]] = 2
            return torch.tensor([code(int(d)) for d in digits]).view(-1, 1, 1, 1).expand(-1, 1, 28, 28).clone()

    held = torch.full((100, 1, 28, 28), 127, dtype=torch.uint8)
    fallback = types.SimpleNamespace(name="stub", images=torch.cat([held] * 6), labels=torch.zeros(600, dtype=torch.long))
    monkeypatch.setattr(mnist_eval, "load_or_train_classifier", lambda *a, **k: Judge())
    result = mnist_eval.evaluate_conditional_generator(OneTwoG(), "/nonexistent", z_dim=4, fallback=fallback,
                                                       per_class=10)
    assert result["agreement"] == [1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert result["mean_agreement"] == pytest.approx(0.95) and result["min_agreement"] == 0.5
    assert "1:50.0%" in result["summary"] and result["num_samples"] == 100


class _Nearest(torch.nn.Module):
    """Logits = minus the squared distance of a 1-D feature to each class's centre."""

    def __init__(self, centers):
        super().__init__()
        self.register_buffer("centers", centers)
        self.weight = torch.nn.Parameter(torch.zeros(1))  # evaluate_mnist_samples reads head.weight.device

    def forward(self, f):
        return -(f - self.centers) ** 2


# -- the auxiliary class loss ------------------------------------------------------------------------------
def test_projection_all_class_logits_hold_the_plain_logit_in_the_label_column():
    from gan_accel.models import ProjectionDiscriminator

    torch.manual_seed(0)
    D = ProjectionDiscriminator(10, width=8).eval()
    x, y = torch.randn(12, 1, 28, 28), torch.arange(12) % 10
    every = D(x, y, all_classes=True)
    assert every.shape == (12, 10)
    torch.testing.assert_close(every[torch.arange(12), y], D(x, y), atol=1e-5, rtol=1e-5)


def test_class_loss_is_the_cross_entropy_of_the_class_logits():
    """The D phase loss with a class weight, against a hand computation with the same networks."""
    import torch.nn.functional as F

    from conftest import make_models
    from gan_accel.engine.context import MicroBatch, StepContext
    from gan_accel.objectives.adversarial import discriminator_loss, generator_loss
    from gan_accel.objectives.losses import LOSSES

    G, D = make_models(0, conditional=True)
    real, y_real = torch.rand(6, 1, 4, 4, dtype=torch.float64) * 2 - 1, torch.tensor([0, 1, 2, 0, 1, 2])
    z, y_fake = torch.randn(6, 4, dtype=torch.float64), torch.tensor([2, 2, 1, 0, 0, 1])
    ctx = StepContext({"G": G, "D": D}, conditional=True)
    ctx.micro = MicroBatch(real, y_real, z, y_fake)
    loss = LOSSES["nonsaturating"]
    d_phase, g_phase = discriminator_loss(loss, 0.3), generator_loss(loss, 0.3)
    ctx.phase = type("P", (), {"net": "D"})()
    fake = G(z, y_fake).detach()
    expected_d = loss.d_loss(D(real, y_real), D(fake, y_fake)) + 0.3 * F.cross_entropy(
        D(real, y_real, all_classes=True), y_real)
    torch.testing.assert_close(d_phase(ctx), expected_d)
    ctx.phase = type("P", (), {"net": "G"})()
    expected_g = loss.g_loss(D(fake, y_fake)) + 0.3 * F.cross_entropy(D(fake, y_fake, all_classes=True), y_fake)
    torch.testing.assert_close(g_phase(ctx), expected_g)


def test_class_loss_needs_a_conditional_run_and_a_d_that_gives_every_class(tmp_path):
    from conftest import NUM_CLASSES, make_images, make_labels, make_loader
    from gan_accel import ConfigError, GANTrainer, PreflightError, TrainConfig

    with pytest.raises(ConfigError, match="class_loss_weight=1.0 needs a conditional run"):
        TrainConfig(class_loss_weight=1.0)
    with pytest.raises(ConfigError, match="class_loss_weight=-1 is invalid"):
        TrainConfig(class_loss_weight=-1, num_classes=3)

    class PlainCondD(torch.nn.Module):  # D(x, y) without all_classes
        def __init__(self):
            super().__init__()
            self.fc, self.embed = torch.nn.Linear(16, 1), torch.nn.Embedding(NUM_CLASSES, 16)

        def forward(self, x, y):
            h = x.flatten(1)
            return self.fc(h).reshape(-1) + (self.embed(y) * h).sum(1)

    from conftest import make_models

    G, _ = make_models(0, dtype=torch.float32, conditional=True)
    images = make_images(16, dtype=torch.float32)
    config = TrainConfig(max_steps=1, batch_size=4, z_dim=4, num_classes=NUM_CLASSES, class_loss_weight=1.0,
                         output_dir=str(tmp_path / "run"), progress_bar=False, num_samples=4)
    with pytest.raises(PreflightError, match="this D does not take all_classes"):
        GANTrainer(G, PlainCondD(), make_loader(images, 4, make_labels(16)), config)


def test_image_moments_by_hand():
    """The centre of mass, in pixels from the frame's centre, with its squares and product, of a one-pixel image
    and of a two-pixel one."""
    from gan_accel.models.dcgan import image_moments

    x = torch.full((2, 1, 5, 5), -1.0)
    x[0, 0, 1, 3] = 1.0  # row 1, column 3: (x, y) = (1, -1) from the centre (2, 2)
    x[1, 0, 0, 4] = 1.0
    x[1, 0, 0, 2] = 0.0  # mass 1 at (2, -2), mass 0.5 at (0, -2): centre ((2 * 1 + 0 * 0.5) / 1.5, -2)
    m = image_moments(x)
    assert m[0].tolist() == pytest.approx([1.0, -1.0, 1.0, 1.0, -1.0], abs=1e-6)
    cx = (2 * 1 + 0 * 0.5) / 1.5
    assert m[1].tolist() == pytest.approx([cx, -2.0, cx * cx, 4.0, -2 * cx], abs=1e-6)


@pytest.mark.parametrize("size", [28, 32, 64])
def test_unconditional_d_positions_see_where_the_content_sits(size):
    """An unconditional D with "moments" or "profiles" gives the same square at two places two logits through
    those reads alone (its convs zeroed), and "profiles" also tells a taller square from a shorter one with
    the same centre; "coords" feeds two coordinate channels; a conditional D refuses "profiles" in one line."""
    from gan_accel.errors import ConfigError
    from gan_accel.models import build_discriminator, default_spec, normalize_spec

    x = torch.full((3, 1, size, size), -1.0)
    x[0, 0, 2:5, 2:5] = x[1, 0, -5:-2, -5:-2] = 1.0  # the same square, top left and bottom right
    x[2, 0, 1:6, 2:5] = 1.0  # taller, the same centre as the first
    for position in ("moments", "profiles"):
        torch.manual_seed(0)
        D = build_discriminator(default_spec("dcgan", size, 1, None, width=4, d_position=position)).eval()
        with torch.no_grad():
            for p in D.net.parameters():
                p.zero_()
            logits = D(x)
        assert logits[0] != logits[1]
        assert bool(logits[0] != logits[2]) is (position == "profiles")  # the moments read only the centre
    D = build_discriminator(default_spec("dcgan", size, 1, None, width=4, d_position="coords"))
    assert D.net[0].in_channels == 3 and D(x).shape == (3,)
    old = {k: v for k, v in default_spec("dcgan", size, 1, None).items() if k != "d_position"}
    assert normalize_spec(old)["d_position"] is None  # a spec recorded before the key builds the same D
    with pytest.raises(ConfigError, match="d_position='profiles': choose one of coords, moments, none"):
        default_spec("dcgan", size, 1, 10, d_position="profiles")
