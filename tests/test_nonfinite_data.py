"""One bad value never becomes a permanent stop: a skipped update puts back the buffers its forward passes
changed (BatchNorm statistics), the messages say what is non-finite and where it came from, and a run
can always go on.

The reference for "the update was skipped" is computed independently of the guard: a twin run on
the same data with the NaN pixel put back to its finite value, whose callback copies the network's
parameters, optimizer state and buffers before the phase and writes them back after it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import IMAGE_SHAPE, TableLatents, Z_DIM, assert_close_dicts, make_images, make_loader
from gan_accel import Callback, DivergenceError, GANTrainer, Phase, TrainConfig, list_checkpoints
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.engine.guard import BufferRestore

N = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
BAD_STEP = 2  # 0-based: the third step's batch holds the NaN pixel


class BNG(nn.Module):
    """A generator with BatchNorm: its running statistics move with every training-mode forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(Z_DIM, 16), nn.BatchNorm1d(16), nn.LeakyReLU(0.2), nn.Linear(16, N),
                                 nn.Tanh())

    def forward(self, z):
        return self.net(z).reshape(z.shape[0], *IMAGE_SHAPE)


class BND(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(N, 16), nn.BatchNorm1d(16), nn.LeakyReLU(0.2),
                                 nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x).reshape(x.shape[0])


def images_with_one_nan_pixel(nan: bool = True) -> torch.Tensor:
    images = make_images(64)
    if nan:
        images[4 * BAD_STEP + 1, 0, 2, 3] = float("nan")  # one pixel of one image of batch BAD_STEP
    return images


def state_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers (state_dict), cloned."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def bn_trainer(tmp_path, mode: str, images: torch.Tensor, name: str = "run", phases=None, table: bool = True,
               **overrides) -> GANTrainer:
    """A 6-step run of BatchNorm networks. ``mode``: "fused" (the default optimizers) or "restore" (non-fused
    Adam): how the skip is done on the device. ``table=False``: the default latents (from the checkpointed RNG: what a resume needs)."""
    cfg = dict(max_steps=6, batch_size=4, z_dim=Z_DIM, log_every=1, sample_every=100, num_samples=4, lr_G=1e-2,
               lr_D=1e-2, warmup_ratio=0.0, checkpoint_every=2, keep_checkpoints=5, output_dir=str(tmp_path / name),
               progress_bar=False)
    cfg.update(overrides)
    torch.manual_seed(0)
    G, D = BNG().double(), BND().double()
    latents = TableLatents(4096) if table else None
    kwargs = dict(latent_sampler=latents or gaussian64, phases=phases)
    if mode == "restore":
        kwargs.update(opt_G=torch.optim.Adam(G.parameters(), lr=1e-2, betas=(0.5, 0.999)),
                      opt_D=torch.optim.Adam(D.parameters(), lr=1e-2, betas=(0.5, 0.999)))
    trainer = GANTrainer(G, D, make_loader(images, 4), TrainConfig(**cfg), **kwargs)
    if latents is not None:
        latents.rewind()
    return trainer


def gaussian64(batch_size: int, device) -> torch.Tensor:
    return torch.randn(batch_size, Z_DIM, device=device, dtype=torch.float64)


class SkipByHand(Callback):
    """Undo one phase of ``net`` at step ``at`` by hand: its parameters, optimizer state and buffers as they
    were after the G phase of the step before (so before a G forward made ahead for this step), and the
    other networks' buffers as they were after the phase that came right before it; written back after it."""

    def __init__(self, net: str, at: int) -> None:
        self.net, self.at, self.saved, self.others = net, at, None, None

    def _tensors(self, trainer):
        module = trainer.accelerator.unwrap_model(trainer.networks[self.net])
        inner = getattr(trainer.optimizers[self.net], "optimizer", trainer.optimizers[self.net])
        states = [t for group in inner.param_groups for p in group["params"] for t in inner.state[p].values()
                  if isinstance(t, torch.Tensor)]
        return [*module.parameters(), *module.buffers(), *states]

    def _other_buffers(self, trainer):
        return [b for name, net in trainer.networks.items() if name != self.net
                for b in trainer.accelerator.unwrap_model(net).buffers()]

    def on_phase_end(self, trainer, phase):
        step = trainer.step  # steps completed before this one
        if phase.name == "G" and step == self.at - 1:
            self.saved = [t.detach().clone() for t in self._tensors(trainer)]
        if step == self.at and phase.name != self.net:  # the phase before ours in this step
            self.others = [b.detach().clone() for b in self._other_buffers(trainer)]
        if phase.name == self.net and step == self.at:
            # (ours first in the step: no other network ran in it, G's forward made ahead is G's phase's)
            others = self._other_buffers(trainer) if self.others is not None else []
            with torch.no_grad():
                for tensor, saved in zip(self._tensors(trainer) + others, self.saved + (self.others or []),
                                         strict=True):
                    tensor.copy_(saved)


@pytest.mark.parametrize("mode", ["fused", "restore"])
def test_one_nan_pixel_skips_that_update_only_and_the_run_goes_on(tmp_path, mode, capsys):
    bad = bn_trainer(tmp_path, mode, images_with_one_nan_pixel(), "bad")
    bad.fit()
    # The twin: finite data, D's update of the bad step undone by hand (D's state copied after G's phase of
    # the step before). The hoisted G forward of that step is G's phase's, in both runs.
    twin = bn_trainer(tmp_path, mode, images_with_one_nan_pixel(nan=False), "twin")
    twin.callbacks.add(SkipByHand("D", BAD_STEP))
    twin.fit()
    for net in ("G", "D"):
        assert_close_dicts(state_of(bad.accelerator.unwrap_model(bad.networks[net])),
                           state_of(twin.accelerator.unwrap_model(twin.networks[net])), atol=0)
    D = bad.accelerator.unwrap_model(bad.D)
    assert all(torch.isfinite(b).all() for b in D.buffers() if b.is_floating_point())
    assert [p.name for p in list_checkpoints(tmp_path / "bad")] == [f"checkpoint_{s:08d}" for s in (2, 4, 6)]
    rows = read_metrics(tmp_path / "bad" / "metrics.jsonl")
    assert [r["skipped/D"] for r in rows] == [0, 0, 1, 1, 1, 1] and all(r["skipped/G"] == 0 for r in rows)
    out = capsys.readouterr().out
    assert "1 update(s) of D with a non-finite loss or gradients skipped by step 3; the real batches held NaN/inf " \
           "values: the data, not the training" in out


def test_a_resume_before_the_bad_batch_goes_past_it_bitwise(tmp_path):
    whole = bn_trainer(tmp_path, "fused", images_with_one_nan_pixel(), "run", table=False)
    whole.fit()
    expected = {net: state_of(whole.accelerator.unwrap_model(whole.networks[net])) for net in ("G", "D")}
    resumed = bn_trainer(tmp_path, "fused", images_with_one_nan_pixel(), "fork", table=False)  # a new run from step 2
    resumed.fit(resume_from=str(tmp_path / "run" / "checkpoints" / "checkpoint_00000002"))
    assert resumed.step == 6
    for net in ("G", "D"):
        assert_close_dicts(state_of(resumed.accelerator.unwrap_model(resumed.networks[net])), expected[net], atol=0)


def poisoned_G_phases(at_step: int):
    from gan_accel import discriminator_loss, generator_loss
    from gan_accel.objectives.losses import LOSSES

    loss = LOSSES["nonsaturating"]
    g_loss = generator_loss(loss)

    def poisoned(ctx):
        value = g_loss(ctx)
        return value + torch.tensor(float("nan"), dtype=value.dtype) if ctx.step == at_step else value

    return [Phase("D", "D", discriminator_loss(loss), new_data=True), Phase("G", "G", poisoned)]


@pytest.mark.parametrize("mode", ["fused", "restore"])
def test_a_skipped_g_update_takes_back_its_forward_made_ahead(tmp_path, mode):
    """G's forward of a step is made once, while drawing D's data, and used by G's phase: a skipped G update
    puts G's BatchNorm statistics back to before that forward, and D's to before the G phase's forward of D
    (the twin: G's state copied after the previous step's G phase, D's buffers after this step's D phase,
    both written back after the bad step's G phase)."""
    bad = bn_trainer(tmp_path, mode, make_images(64), "bad", phases=poisoned_G_phases(BAD_STEP))
    bad.fit()
    twin = bn_trainer(tmp_path, mode, make_images(64), "twin", phases=poisoned_G_phases(-1))
    twin.callbacks.add(SkipByHand("G", BAD_STEP))
    twin.fit()
    assert bad.guard.skipped == {"G": 1, "D": 0}
    for net in ("G", "D"):
        assert_close_dicts(state_of(bad.accelerator.unwrap_model(bad.networks[net])),
                           state_of(twin.accelerator.unwrap_model(twin.networks[net])), atol=0)


def test_the_byte_copies_put_back_every_kind_of_buffer_exactly():
    """Float statistics (NaN included), integer counters and boolean flags: restore_where() with a 1.0 flag
    gives back the saved bytes, with a 0.0 flag changes nothing."""
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("stats", torch.arange(6, dtype=torch.float32).reshape(2, 3))
            self.register_buffer("count", torch.tensor(7))
            self.register_buffer("fresh", torch.tensor(True))
            self.register_buffer("low", torch.ones(5, dtype=torch.float16))

    nets = {"G": Odd(), "D": nn.BatchNorm1d(3)}
    restore = BufferRestore(nets)
    before = {f"{n}.{k}": b.clone() for n, m in nets.items() for k, b in m.named_buffers()}

    def spoil():
        for module in nets.values():
            for buffer in module.buffers():
                buffer.copy_(torch.full_like(buffer, float("nan")) if buffer.is_floating_point() else
                             torch.zeros_like(buffer) if buffer.dtype == torch.bool else buffer + 5)

    def now():
        return {f"{n}.{k}": b.clone() for n, m in nets.items() for k, b in m.named_buffers()}

    restore.save()
    spoil()
    spoiled = now()
    restore.restore_where(torch.tensor(1.0))
    assert all(torch.equal(before[k], v) for k, v in now().items())
    spoil()
    restore.restore_where(torch.tensor(0.0))
    assert all(torch.equal(spoiled[k], v) or (spoiled[k].isnan().all() and v.isnan().all())
               for k, v in now().items())


def test_guard_off_refusal_names_the_buffers_and_claims_no_checkpoint(tmp_path):
    """nan_guard=False: the NaN pixel reaches D's BatchNorm statistics and weights; the refusal names them,
    says the guard was off, and (no checkpoint written yet) that there is none to resume."""
    trainer = bn_trainer(tmp_path, "fused", images_with_one_nan_pixel(), nan_guard=False, checkpoint_every=4)
    with pytest.raises(DivergenceError) as raised:
        trainer.fit()
    message = str(raised.value)
    assert "refusing to write a checkpoint at step 4" in message
    assert "D's buffers net.2.running_mean, net.2.running_var" in message and "D's weights" in message
    assert "nan_guard is off" in message and "nan_guard=True" in message
    assert "No checkpoint of this run was written" in message and "last complete checkpoint is" not in message
    assert list_checkpoints(tmp_path / "run") == []


def test_consecutive_bad_batches_say_the_data_and_how_to_go_on(tmp_path):
    """Batches 3-5 hold a NaN each: with max_bad_updates=3 the run stops naming the data, the step, the
    checkpoint that exists and the way on; continuing from it with a larger max_bad_updates goes past them."""
    images = make_images(64)
    for batch in (2, 3, 4):
        images[4 * batch, 0, 0, 0] = float("nan")
    trainer = bn_trainer(tmp_path, "fused", images, max_steps=8, max_bad_updates=3, table=False)
    with pytest.raises(DivergenceError) as raised:
        trainer.fit()
    message = str(raised.value)
    assert "D's updates were skipped for 3 consecutive updates (noticed at step 5)" in message
    assert "the real batches held NaN/inf values: the data, not the training, made them non-finite" in message
    assert "continue with a larger max_bad_updates (now 3; --max-bad-updates N)" in message
    assert "checkpoint_00000004" in message and "--resume latest" in message
    again = bn_trainer(tmp_path, "fused", images, max_steps=8, max_bad_updates=4, table=False)
    again.fit(resume_from="latest")
    assert again.step == 8 and again.guard.skipped == {"G": 0, "D": 3}
    D = again.accelerator.unwrap_model(again.D)
    assert all(torch.isfinite(t).all() for t in D.state_dict().values() if t.is_floating_point())


def test_the_guard_benchmark_steps_all_three_designs_alike(tmp_path, monkeypatch):
    """benchmarks/guard_overhead.py (a few steps, no timing): every variant steps; the host-read one decides
    like the engine on a NaN batch (D skipped bitwise, G not)."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    sys.modules.pop("guard_overhead", None)
    import guard_overhead

    assert all(t > 0 for t in guard_overhead.measure("DCGAN width 32, batch 64", 2, 1))
    trainer = bn_trainer(tmp_path, "fused", images_with_one_nan_pixel())
    runner = trainer.runner
    guard_overhead.read_on_host(runner)
    runner.batches = iter(trainer.data)
    D = []
    for _ in range(BAD_STEP + 1):
        runner.run_step(lambda phase: D.append(state_of(runner.nets["D"])) if phase.net == "D" else None)
    assert torch.equal(D[-1]["net.1.weight"], D[-2]["net.1.weight"])  # the bad step's D update skipped
    assert not torch.equal(D[-2]["net.1.weight"], D[-3]["net.1.weight"])
    assert all(torch.isfinite(b).all() for b in runner.nets["D"].buffers() if b.is_floating_point())
