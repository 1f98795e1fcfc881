"""The engine's update rules, each checked against an independent computation."""

from __future__ import annotations

import pytest
import torch

from conftest import (NUM_CLASSES, TableLabels, TableLatents, assert_close_dicts, make_images, make_labels, make_loader,
                      make_models, params)
from gan_accel import Callback, GANTrainer, TrainConfig
from gan_accel.objectives.losses import LOSSES
from gan_accel.engine.schedules import warmup_then_decay
from gan_accel.callbacks.metrics_log import read_metrics

# count_optimizer_steps wraps the inner optimizers' step, which torch's scheduler notices and warns about.
pytestmark = pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")


def make_trainer(tmp_path, *, batch_size=4, images=None, seed=0, latents=None, conditional=False,
                 **overrides) -> GANTrainer:
    """Tiny float64 G and D; ``conditional``: G(z, y), a projection D(x, y), labelled data, tabled G labels."""
    cfg = dict(max_steps=3, batch_size=batch_size, z_dim=4, log_every=1, sample_every=1000, num_samples=4,
               output_dir=str(tmp_path / "run"), progress_bar=False, warmup_ratio=0.0, lr_G=1e-2, lr_D=1e-2,
               num_classes=NUM_CLASSES if conditional else None)
    cfg.update(overrides)
    config = TrainConfig(**cfg)
    G, D = make_models(seed, conditional=conditional)
    images = make_images(64) if images is None else images
    labels = make_labels(len(images)) if conditional else None
    latents = latents or TableLatents(4096)
    fake_labels = TableLabels() if conditional else None
    trainer = GANTrainer(G, D, make_loader(images, batch_size, labels), config, latent_sampler=latents,
                         label_sampler=fake_labels)
    latents.rewind()
    if fake_labels is not None:
        fake_labels.rewind()
    return trainer


def count_optimizer_steps(trainer: GANTrainer) -> dict[str, int]:
    """Wrap the *inner* torch optimizers: they only step when Accelerate really steps."""
    counts = {"G": 0, "D": 0}
    for name, prepared in (("G", trainer.opt_G), ("D", trainer.opt_D)):
        inner = prepared.optimizer
        original = inner.step

        def counting_step(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        inner.step = counting_step
    return counts


# -- (a) isolation -----------------------------------------------------------------------------
class IsolationSpy(Callback):
    """Snapshots both networks before the run and after every phase, with the gradients left behind."""

    def __init__(self):
        self.records = []

    def on_fit_start(self, trainer):
        self.records.append(("start", params(trainer.G), params(trainer.D), None))

    def on_phase_end(self, trainer, phase):
        frozen_left = [n for n, net in trainer.networks.items() if not all(p.requires_grad for p in net.parameters())]
        grads = {n: [p.grad for p in net.parameters()] for n, net in trainer.networks.items()}
        self.records.append((phase.name, params(trainer.G), params(trainer.D), (grads, frozen_left)))


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_each_update_leaves_the_other_network_unchanged_and_gradient_free(tmp_path, grad_accum_steps):
    trainer = make_trainer(tmp_path, n_critic=2, grad_accum_steps=grad_accum_steps, max_steps=2)
    counts = count_optimizer_steps(trainer)
    spy = IsolationSpy()
    trainer.callbacks.add(spy)
    trainer.fit()
    assert counts == {"G": 2, "D": 4}
    assert [r[0] for r in spy.records] == ["start", "D", "D", "G", "D", "D", "G"]
    for (_, G_before, D_before, _), (name, G_after, D_after, (grads, frozen_left)) in zip(spy.records, spy.records[1:]):
        other = "G" if name == "D" else "D"
        before, after = {"G": G_before, "D": D_before}, {"G": G_after, "D": D_after}
        assert_close_dicts(after[other], before[other], atol=0)  # the other network did not move
        assert any(not torch.equal(after[name][k], before[name][k]) for k in before[name]), f"{name} did not move"
        assert all(g is None for g in grads[other]), f"phase {name} left gradients in {other}"
        assert all(g is None for g in grads[name]), "zero_grad(set_to_none) must follow every step"
        assert frozen_left == [], "every network must be trainable again after a phase"


# -- (b) accumulation == larger batch -----------------------------------------------------------
@pytest.mark.parametrize("k, conditional, class_weight", [(2, False, 0.0), (4, False, 0.0), (2, True, 0.0), (2, True, 0.5)],
                         ids=["k2", "k4", "k2-conditional", "k2-conditional-class-loss"])
def test_accumulation_equals_larger_batch(tmp_path, k, conditional, class_weight):
    """k micro-batches of b with accumulation k == one batch of k*b, for G and D, over several steps.

    float64 networks: the two runs differ only by summation order (a sum of k partial means versus
    one mean), ~1e-16 relative per gradient; over 4 Adam steps (whose eps=1e-8 bounds the
    amplification of tiny gradients) that stays far below the 1e-10 tolerance, while any real
    mistake (a wrong scale, a missed or extra step, a stale D in the G phase) moves parameters
    by ~lr = 1e-2.
    """
    b, steps = 4, 4
    images = make_images(k * b * steps * 2)
    extra = {"class_loss_weight": class_weight} if class_weight else {}
    small = make_trainer(tmp_path / "small", batch_size=b, grad_accum_steps=k, max_steps=steps, images=images,
                         conditional=conditional, **extra)
    counts = count_optimizer_steps(small)
    small.fit()
    assert counts == {"G": steps, "D": steps}
    assert small.step == steps and small.d_step == steps
    assert small.images_seen == k * b * steps, "each optimizer step must consume exactly k micro-batches"
    small_G, small_D = params(small.G), params(small.D)

    from conftest import reset_accelerate_state

    reset_accelerate_state()
    big = make_trainer(tmp_path / "big", batch_size=k * b, max_steps=steps, images=images, conditional=conditional,
                       **extra)
    big.fit()
    assert_close_dicts(small_G, params(big.G), atol=1e-10)
    assert_close_dicts(small_D, params(big.D), atol=1e-10)


def test_accumulation_windows_cross_epoch_ends(tmp_path):
    """3 batches per epoch with accumulation 2: no optimizer step may be cut short at an epoch end."""
    trainer = make_trainer(tmp_path, batch_size=4, images=make_images(12), grad_accum_steps=2, max_steps=3)
    counts = count_optimizer_steps(trainer)
    trainer.fit()
    assert counts == {"G": 3, "D": 3}
    assert trainer.images_seen == 3 * 2 * 4
    assert trainer.epoch == 1  # 6 batches over 3-batch epochs: zero-based epoch 1 is the second


# -- (c) plain PyTorch twin ----------------------------------------------------------------------
def plain_pytorch_gan(images, batch_size, steps, loss_name, latents, lr=1e-2, warmup_ratio=0.0, clip_D=None, clip_G=None,
                      labels=None, fake_labels=None, class_weight=0.0):
    """The textbook loop, no Accelerate: D step on detached fakes, then G step through a frozen D.

    With ``labels``: the conditional textbook loop, D(x, y) on real images with their labels, G(z, y)
    with labels from ``fake_labels`` and D(G(z, y), y). ``class_weight``: plus that times the
    cross-entropy of D's class logits on real images (D's loss) and on G's samples (G's loss).
    """
    import torch.nn.functional as F

    loss = LOSSES[loss_name]
    conditional = labels is not None
    G, D = make_models(0, conditional=conditional)
    opt_G = torch.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)  # as gan_accel builds it
    opt_D = torch.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999), fused=True)
    multiplier = warmup_then_decay(steps, int(warmup_ratio * steps), "linear")
    sched_G = torch.optim.lr_scheduler.LambdaLR(opt_G, multiplier)
    sched_D = torch.optim.lr_scheduler.LambdaLR(opt_D, multiplier)
    for step in range(steps):
        real = images[step * batch_size : (step + 1) * batch_size]
        if conditional:
            y_real = labels[step * batch_size : (step + 1) * batch_size]
            y_fake = fake_labels(batch_size, torch.device("cpu"))
            fake = G(latents(batch_size, torch.device("cpu")), y_fake)
            d_real, d_fake, d_fake_for_G = (lambda: D(real, y_real)), (lambda: D(fake.detach(), y_fake)), (
                lambda: D(fake, y_fake))
        else:
            fake = G(latents(batch_size, torch.device("cpu")))
            d_real, d_fake, d_fake_for_G = (lambda: D(real)), (lambda: D(fake.detach())), (lambda: D(fake))
        opt_D.zero_grad()
        d_total = loss.d_loss(d_real(), d_fake())
        if class_weight:
            d_total = d_total + class_weight * F.cross_entropy(D(real, y_real, all_classes=True), y_real)
        d_total.backward()
        if clip_D:
            torch.nn.utils.clip_grad_norm_(D.parameters(), clip_D)
        opt_D.step()
        sched_D.step()
        opt_G.zero_grad()
        for p in D.parameters():
            p.requires_grad_(False)
        g_total = loss.g_loss(d_fake_for_G())
        if class_weight:
            g_total = g_total + class_weight * F.cross_entropy(D(fake, y_fake, all_classes=True), y_fake)
        g_total.backward()
        for p in D.parameters():
            p.requires_grad_(True)
        if clip_G:
            torch.nn.utils.clip_grad_norm_(G.parameters(), clip_G)
        opt_G.step()
        sched_G.step()
    return params(G), params(D)


@pytest.mark.parametrize(
    "loss_name, clip",
    [("nonsaturating", None), ("hinge", None), ("wasserstein", 0.5), ("least_squares", None)],
)
def test_engine_matches_plain_pytorch_loop(tmp_path, loss_name, clip):
    steps, b = 5, 8
    images = make_images(steps * b)
    trainer = make_trainer(tmp_path, batch_size=b, max_steps=steps, images=images, loss=loss_name,
                           warmup_ratio=0.4, clip_grad_norm_D=clip, clip_grad_norm_G=clip)
    trainer.fit()
    twin_G, twin_D = plain_pytorch_gan(images, b, steps, loss_name, TableLatents(4096), warmup_ratio=0.4,
                                       clip_D=clip, clip_G=clip)
    # Same ops in the same order on CPU: the only difference allowed is Accelerate's loss / 1.
    assert_close_dicts(params(trainer.G), twin_G, atol=1e-12)
    assert_close_dicts(params(trainer.D), twin_D, atol=1e-12)


@pytest.mark.parametrize("label_distribution, class_weight", [("sampler", 0.0), ("data", 0.0), ("sampler", 0.7)],
                         ids=["sampler", "data", "sampler-class-loss"])
def test_conditional_engine_matches_the_conditional_plain_loop(tmp_path, label_distribution, class_weight):
    """Labels reach D with their own images, and G's labels reach both G and D's judgement of G's samples.

    ``data``: G is given the real batch's labels (the data's class frequencies)."""
    steps, b = 5, 8
    images = make_images(steps * b)
    if label_distribution == "data":
        G, D = make_models(0, conditional=True)
        latents = TableLatents(4096)
        config = TrainConfig(max_steps=steps, batch_size=b, z_dim=4, log_every=1, sample_every=1000, num_samples=4,
                             output_dir=str(tmp_path / "run"), progress_bar=False, warmup_ratio=0.4, lr_G=1e-2,
                             lr_D=1e-2, num_classes=NUM_CLASSES, label_distribution="data")
        trainer = GANTrainer(G, D, make_loader(images, b, make_labels(len(images))), config, latent_sampler=latents)
        latents.rewind()
        fake_labels = iter(make_labels(len(images)).split(b))
        twin_fake_labels = lambda n, device: next(fake_labels)  # noqa: E731 -- the real batch's labels
    else:
        trainer = make_trainer(tmp_path, batch_size=b, max_steps=steps, images=images, warmup_ratio=0.4,
                               conditional=True, class_loss_weight=class_weight)
        twin_fake_labels = TableLabels()
    trainer.fit()
    twin_G, twin_D = plain_pytorch_gan(images, b, steps, "nonsaturating", TableLatents(4096), warmup_ratio=0.4,
                                       labels=make_labels(len(images)), fake_labels=twin_fake_labels,
                                       class_weight=class_weight)
    # The class loss reads D's logit from the all-class matrix (a matmul) where the twin calls D(x, y)
    # (an elementwise sum): the same numbers up to round-off, which Adam's normalisation of tiny
    # gradients (embedding rows of classes absent from a batch) lifts to ~1e-9; a real mistake moves
    # parameters by ~lr = 1e-2.
    atol = 1e-8 if class_weight else 1e-12
    assert_close_dicts(params(trainer.G), twin_G, atol=atol)
    assert_close_dicts(params(trainer.D), twin_D, atol=atol)
    if class_weight:  # and the class loss really moved the networks
        plain_G, _ = plain_pytorch_gan(images, b, steps, "nonsaturating", TableLatents(4096), warmup_ratio=0.4,
                                       labels=make_labels(len(images)), fake_labels=TableLabels())
        assert max((plain_G[k] - twin_G[k]).abs().max() for k in twin_G) > 1e-4
    # The twin with labels shuffled against their images ends elsewhere: pairing is what is tested.
    wrong_G, _ = plain_pytorch_gan(images, b, steps, "nonsaturating", TableLatents(4096), warmup_ratio=0.4,
                                   labels=make_labels(len(images)).roll(1), fake_labels=TableLabels())
    assert max((wrong_G[k] - twin_G[k]).abs().max() for k in twin_G) > 1e-4


# -- (e) n_critic ---------------------------------------------------------------------------------
def test_n_critic_five_steps_discriminator_five_times_per_generator_step(tmp_path):
    steps, n_critic = 3, 5
    trainer = make_trainer(tmp_path, n_critic=n_critic, max_steps=steps, images=make_images(128),
                           warmup_ratio=0.2, loss="wasserstein")
    counts = count_optimizer_steps(trainer)
    trainer.fit()
    assert counts == {"G": steps, "D": n_critic * steps}
    assert (trainer.step, trainer.d_step) == (steps, n_critic * steps)
    # Each scheduler has advanced once per step of its own optimizer, along its own curve.
    assert trainer.sched_G.scheduler.last_epoch == steps
    assert trainer.sched_D.scheduler.last_epoch == n_critic * steps
    expected_D = warmup_then_decay(n_critic * steps, int(0.2 * n_critic * steps))(n_critic * steps)
    assert trainer.opt_D.param_groups[0]["lr"] == pytest.approx(1e-2 * expected_D)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["d_step"] for r in rows] == [5, 10, 15]
    # The lr each D step used: the curve over 15 D steps, sampled at the last D step of each G step.
    d_curve = warmup_then_decay(15, 3)
    assert [r["lr/D"] for r in rows] == pytest.approx([1e-2 * d_curve(s - 1) for s in (5, 10, 15)])
    g_curve = warmup_then_decay(3, 0)
    assert [r["lr/G"] for r in rows] == pytest.approx([1e-2 * g_curve(s) for s in range(3)])


# -- (f) bf16 -----------------------------------------------------------------------------------
def test_bf16_run_on_cpu_is_autocast_and_finite(tmp_path):
    from gan_accel.models import DCGANDiscriminator, DCGANGenerator

    torch.manual_seed(0)
    G, D = DCGANGenerator(z_dim=8, width=8), DCGANDiscriminator(width=8)
    conv_dtypes = []
    D.net[0].register_forward_hook(lambda m, i, o: conv_dtypes.append(o.dtype))
    images = torch.rand(32, 1, 28, 28) * 2 - 1
    config = TrainConfig(max_steps=3, batch_size=8, z_dim=8, mixed_precision="bf16", log_every=1,
                         sample_every=3, num_samples=4, output_dir=str(tmp_path / "run"), progress_bar=False)
    metrics = GANTrainer(G, D, make_loader(images, 8), config).fit()
    assert torch.bfloat16 in conv_dtypes, "D's convolutions did not run under bf16 autocast"
    for key in ("loss/D", "loss/G", "D(x)", "D(G(z))"):
        assert torch.isfinite(torch.tensor(metrics[key])), key
    assert (tmp_path / "run" / "samples_000003.png").exists()
