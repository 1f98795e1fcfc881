"""Divergence guard: NaN updates are skipped and logged, persistent NaNs stop the run, no NaN checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import TableLatents, assert_close_dicts, make_images, make_loader, make_models, params
from gan_accel import Callback, DivergenceError, GANTrainer, TrainConfig, list_checkpoints
from gan_accel.callbacks.metrics_log import read_metrics
from gan_accel.storage.checkpoint import read_engine_state


def trainer_on(images, tmp_path, **overrides) -> GANTrainer:
    cfg = dict(max_steps=4, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4, lr_G=1e-2,
               lr_D=1e-2, warmup_ratio=0.0, output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    G, D = make_models()
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(images, 4), TrainConfig(**cfg), latent_sampler=latents)
    latents.rewind()
    return trainer


def test_one_nan_batch_skips_that_d_update_and_is_logged(tmp_path):
    images = make_images(16)
    images[4:8] = float("nan")  # the second batch: D's loss on it is NaN
    trainer = trainer_on(images, tmp_path)
    snapshots = []

    class RecordD(Callback):
        def on_phase_end(self, trainer, phase):
            if phase.net == "D":
                snapshots.append(params(trainer.D))  # D right after its (possibly skipped) update

    trainer.callbacks.add(RecordD())
    D_initial = params(trainer.D)
    trainer.fit()
    # Step 2's D update was skipped: D after step 2 equals D after step 1; steps 1, 3, 4 moved D.
    assert all(torch.equal(snapshots[1][k], snapshots[0][k]) for k in D_initial)
    assert not all(torch.equal(snapshots[0][k], D_initial[k]) for k in D_initial)
    assert not all(torch.equal(snapshots[2][k], snapshots[1][k]) for k in D_initial)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["skipped/D"] for r in rows] == [0, 1, 1, 1] and all(r["skipped/G"] == 0 for r in rows)
    assert all(torch.isfinite(p).all() for p in trainer.D.parameters())
    assert all(torch.isfinite(p).all() for p in trainer.G.parameters())


def test_consecutive_nan_updates_stop_the_run_without_writing_a_checkpoint(tmp_path):
    images = make_images(16)
    images[4:] = float("nan")  # every batch after the first
    trainer = trainer_on(images, tmp_path, max_steps=20, max_bad_updates=3, checkpoint_every=1)
    # the data made them non-finite, and the message says so (tests/test_nonfinite_data.py)
    with pytest.raises(DivergenceError, match="skipped for 3 consecutive updates .* the data, not the training"):
        trainer.fit()
    assert trainer.guard.skipped["D"] == 3
    # Only step 1's checkpoint and the steps where D skipped (weights still finite) exist; all finite.
    for checkpoint in list_checkpoints(tmp_path / "run"):
        state = read_engine_state(checkpoint, 0)
        assert state["step"] <= 3
    assert all(torch.isfinite(p).all() for p in trainer.D.parameters())


def test_checkpoint_with_non_finite_weights_is_refused_and_older_one_kept(tmp_path):
    images = make_images(16)
    images[8:] = float("nan")
    # Guard off: the NaN reaches the weights in step 3; the checkpoint at step 4 must be refused.
    trainer = trainer_on(images, tmp_path, nan_guard=False, checkpoint_every=2, max_steps=4)
    with pytest.raises(DivergenceError, match="refusing to write a checkpoint at step 4"):
        trainer.fit()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["checkpoint_00000002"]


# -- the skip is decided on the device ---------------------------------------------------------------
class NaNGradient(torch.autograd.Function):
    """Identity forward (the loss stays finite), NaN backward (every gradient becomes NaN)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def poisoned_phases(at_step: int, how: str, rank: int | None = None):
    """The default phases, with D's loss made non-finite ("loss": + a constant NaN, gradients stay
    finite) or its gradients ("grad") at step ``at_step`` (on process ``rank`` only, if given)."""
    from accelerate import PartialState

    from gan_accel import Phase, discriminator_loss, generator_loss
    from gan_accel.objectives.losses import LOSSES

    loss = LOSSES["nonsaturating"]
    d_loss = discriminator_loss(loss)

    def poisoned(ctx):
        value = d_loss(ctx)
        if ctx.step == at_step and (rank is None or PartialState().process_index == rank):
            value = value + torch.tensor(float("nan"), dtype=value.dtype) if how == "loss" else NaNGradient.apply(value)
        return value

    return [Phase("D", "D", poisoned, new_data=True), Phase("G", "G", generator_loss(loss))]


def optimizer_state(optimizer) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optimizer", optimizer)
    return [t.detach().clone() for group in inner.param_groups for p in group["params"]
            for t in inner.state[p].values()]


class RecordPhase(Callback):
    """D's parameters and optimizer state right after each of its (possibly skipped) updates."""

    def __init__(self, net: str = "D") -> None:
        self.net, self.params, self.states = net, [], []

    def on_phase_end(self, trainer, phase):
        if phase.net == self.net:
            self.params.append(params(trainer.networks[self.net]))
            self.states.append(optimizer_state(trainer.optimizers[self.net]))


def unfused_adam(trainer_kwargs: dict, G, D) -> dict:
    return dict(trainer_kwargs, opt_G=torch.optim.Adam(G.parameters(), lr=1e-2, betas=(0.5, 0.999)),
                opt_D=torch.optim.Adam(D.parameters(), lr=1e-2, betas=(0.5, 0.999)))


def guarded_trainer(tmp_path, mode: str, name: str = "run", phases=None, **overrides) -> GANTrainer:
    """A 6-step run whose optimizers take the skip ``mode``: "fused" (the default optimizers) or "restore"
    (non-fused Adam; its first step, before its state exists, reads the verdict: "read")."""
    cfg = dict(max_steps=6, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4, lr_G=1e-2,
               lr_D=1e-2, warmup_ratio=0.0, output_dir=str(tmp_path / name), progress_bar=False)
    cfg.update(overrides)
    G, D = make_models()
    latents = TableLatents(4096)
    kwargs = dict(latent_sampler=latents, phases=phases)
    if mode == "restore":
        kwargs = unfused_adam(kwargs, G, D)
    trainer = GANTrainer(G, D, make_loader(make_images(64), 4), TrainConfig(**cfg), **kwargs)
    latents.rewind()
    return trainer


@pytest.mark.parametrize("mode", ["fused", "restore"])
@pytest.mark.parametrize("how", ["loss", "grad"])
def test_a_non_finite_update_is_skipped_bitwise_weights_and_optimizer_state(tmp_path, mode, how):
    trainer = guarded_trainer(tmp_path, mode, phases=poisoned_phases(at_step=2, how=how))
    record = RecordPhase()
    trainer.callbacks.add(record)
    trainer.fit()
    # "restore" needs the optimizer's state to exist: each optimizer's first step reads the verdict
    expected = {"fused": {"fused": 12}, "restore": {"read": 2, "restore": 10}}[mode]
    assert trainer.runner.skippable.modes_used == expected
    # Step 2 (0-based) was skipped: D and its Adam state (moments and step counter) after it are bitwise
    # those after step 1; the steps around it moved D.
    assert all(torch.equal(record.params[2][k], record.params[1][k]) for k in record.params[1])
    assert len(record.states[2]) == len(record.states[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(record.states[2], record.states[1]))
    assert not all(torch.equal(record.params[1][k], record.params[0][k]) for k in record.params[1])
    assert not all(torch.equal(record.params[3][k], record.params[2][k]) for k in record.params[1])
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["skipped/D"] for r in rows] == [0, 0, 1, 1, 1, 1] and all(r["skipped/G"] == 0 for r in rows)
    assert all(torch.isfinite(p).all() for p in trainer.D.parameters())


@pytest.mark.parametrize("mode", ["fused", "restore"])
def test_the_guard_changes_no_bit_of_a_run_on_finite_data(tmp_path, mode):
    on = guarded_trainer(tmp_path, mode, "on", clip_grad_norm_D=0.5)
    on.fit()
    off = guarded_trainer(tmp_path, mode, "off", nan_guard=False, clip_grad_norm_D=0.5)
    off.fit()
    assert on.runner.skippable.modes_used.get(mode, 0) > 0
    for net in ("G", "D"):
        assert_close_dicts(params(on.networks[net]), params(off.networks[net]), atol=0)
        assert all(torch.equal(a, b) for a, b in zip(optimizer_state(on.optimizers[net]),
                                                      optimizer_state(off.optimizers[net])))
    rows_on, rows_off = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("on", "off"))
    assert [r["grad_norm/D"] for r in rows_on] == [r["grad_norm/D"] for r in rows_off]


def test_divergence_is_raised_by_the_next_log_row_even_after_the_nans_stopped(tmp_path):
    """The counters live on the device and are read at log rows: updates 2 and 3 skipped (max 2),
    then finite again; the row at step 5 still raises."""
    images = make_images(64)
    images[8:16] = float("nan")  # batches 2 and 3
    trainer = trainer_on(images, tmp_path, max_steps=12, log_every=5, max_bad_updates=2)
    with pytest.raises(DivergenceError, match=r"skipped for 2 consecutive updates \(noticed at step 5\)"):
        trainer.fit()
    assert trainer.step == 5 and trainer.guard.skipped == {"G": 0, "D": 2}


def test_divergence_is_raised_before_a_checkpoint_is_written(tmp_path):
    images = make_images(64)
    images[4:] = float("nan")
    trainer = trainer_on(images, tmp_path, max_steps=12, log_every=100, checkpoint_every=4, max_bad_updates=3)
    with pytest.raises(DivergenceError, match="noticed at step 4"):
        trainer.fit()
    assert list_checkpoints(tmp_path / "run") == []


class CountHostReads(Callback):
    """Counts tensor-to-host reads (item, tolist, bool, float, int) during steps that log nothing."""

    READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")

    def __init__(self, monkeypatch, skip_first: int = 1) -> None:
        self.monkeypatch, self.skip_first, self.reads, self.counting = monkeypatch, skip_first, [], False
        for name in self.READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, original))

    def _counted(self, name, original):
        def read(tensor, *args, **kwargs):
            if self.counting:
                self.reads.append(name)
            return original(tensor, *args, **kwargs)
        return read

    def on_step_end(self, trainer):
        self.counting = trainer.step >= self.skip_first and trainer.step < trainer.config.max_steps - 1


def test_a_step_reads_nothing_back_from_the_device(tmp_path, monkeypatch):
    """With the guard on (default optimizers, fused Adam) a step that logs nothing reads no tensor
    on the host: no sync per step (counted on CPU, where every read would be one on a GPU)."""
    trainer = guarded_trainer(tmp_path, "fused", max_steps=8, log_every=100, clip_grad_norm_D=1.0)
    counter = CountHostReads(monkeypatch)
    trainer.callbacks.add(counter, before="signal_handler")
    trainer.fit()
    assert trainer.runner.skippable.modes_used == {"fused": 16}
    assert counter.reads == []


# -- two processes: every rank skips alike ----------------------------------------------------------
def _rank_local_nan(out_dir: str) -> None:
    """Runs on each of 2 processes: D's loss is NaN on rank 1 only, at step 2 (its gradients stay finite,
    so only the agreed flag can make rank 0 skip too)."""
    import os

    from accelerate import PartialState

    trainer = guarded_trainer(Path(out_dir), "fused", phases=poisoned_phases(at_step=2, how="loss", rank=1))
    record = RecordPhase()
    trainer.callbacks.add(record)
    trainer.fit()
    rank = PartialState().process_index
    torch.save({"params": record.params, "states": record.states, "skipped": trainer.guard.skipped,
                "modes": trainer.runner.skippable.modes_used}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.slow
def test_two_processes_skip_a_rank_local_non_finite_update_alike(tmp_path):
    from conftest import launch_two_processes

    launch_two_processes(_rank_local_nan, args=(str(tmp_path),), num_processes=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for seen in ranks:
        assert seen["modes"] == {"fused": 12} and seen["skipped"] == {"G": 0, "D": 1}
        assert all(torch.equal(seen["params"][2][k], seen["params"][1][k]) for k in seen["params"][1])
        assert all(torch.equal(a, b) for a, b in zip(seen["states"][2], seen["states"][1]))
        assert not all(torch.equal(seen["params"][3][k], seen["params"][2][k]) for k in seen["params"][2])
    for step in range(6):  # the ranks stay bitwise identical
        assert_close_dicts(ranks[0]["params"][step], ranks[1]["params"][step], atol=0)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["skipped/D"] for r in rows] == [0, 0, 1, 1, 1, 1]


# -- the counters and the flag against hand counts ------------------------------------------------------
@pytest.mark.parametrize("verdicts", [[0, 1, 1, 0, 1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 1], [1, 0, 1, 0, 1]])
def test_the_counters_agree_with_a_hand_count_on_every_sequence_of_verdicts(verdicts):
    """Updates with a NaN loss where ``verdicts`` says 1: the verdicts, the skips, the longest run (hence the
    DivergenceError) and the checkpointed state, against a hand count."""
    from gan_accel.engine.guard import DivergenceGuard

    def hand_count(flags):
        longest = run = 0
        for flag in flags:
            run = run + 1 if flag else 0
            longest = max(longest, run)
        return run, sum(flags), longest

    consecutive, skipped, longest = hand_count(verdicts)
    for limit in (2, 3):
        guard = DivergenceGuard(limit, ("D",))
        seen = [float(guard.verdict("D", torch.tensor(float("nan") if flag else 0.5), [])) for flag in verdicts]
        assert seen == [float(flag) for flag in verdicts]
        assert guard.state_dict() == {"consecutive": {"D": consecutive}, "skipped": {"D": skipped}}
        if longest >= limit:
            with pytest.raises(DivergenceError, match=f"non-finite for {longest} consecutive"):
                guard.check(step=len(verdicts))
        else:
            assert guard.check(step=len(verdicts)) == {"skipped/D": skipped}


def test_a_resumed_guard_counts_on_from_its_state():
    """load_state_dict, then more verdicts: a run of skips that began before the checkpoint still counts."""
    from gan_accel.engine.guard import DivergenceGuard

    guard = DivergenceGuard(3, ("G", "D"))
    guard.load_state_dict({"consecutive": {"D": 2, "G": 0}, "skipped": {"D": 5, "G": 1}})
    guard.verdict("G", torch.tensor(0.5), [])
    guard.verdict("D", torch.tensor(float("inf")), [])
    assert guard.skipped == {"G": 1, "D": 6}
    with pytest.raises(DivergenceError, match="D's loss or gradients were non-finite for 3 consecutive"):
        guard.check(step=7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_flag_is_a_hand_check_for_every_place_a_nan_or_inf_can_be(dtype):
    """non_finite_flag over a loss and gradients: 1.0 exactly when a hand check finds a NaN or inf; the values
    are left as they were; a flag passed in is raised, never lowered."""
    from gan_accel.engine.guard import non_finite_flag

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).to(dtype)
    params_ = list(net.parameters())
    cases = [("finite", None, 0.5), ("nan loss", None, float("nan")), ("inf loss", None, float("inf")),
             ("nan weight grad", (0, float("nan")), 0.5), ("-inf bias grad", (3, float("-inf")), 0.5)]
    for label, poison, loss_value in cases:
        for index, p in enumerate(params_):
            p.grad = torch.full_like(p, 0.25)
            if poison is not None and poison[0] == index:
                p.grad.view(-1)[-1] = poison[1]
        loss = torch.tensor(loss_value, dtype=dtype)
        grads = [p.grad for p in params_]
        by_hand = not torch.isfinite(loss).item() or any(not torch.isfinite(g).all() for g in grads)
        flag = non_finite_flag([loss.reshape(1), *grads])
        assert flag.dtype == torch.float32 and flag.shape == () and float(flag) == float(by_hand), label
        assert float(non_finite_flag([loss.reshape(1)])) == float(not torch.isfinite(loss).item()), label
        assert float(non_finite_flag([loss.reshape(1)], torch.tensor(1.0))) == 1.0, label
        if poison is None:  # unchanged by the check (it "unscales" by 1)
            assert all(torch.equal(p.grad, torch.full_like(p, 0.25)) for p in params_)
