"""The opt-in speed options: channels_last, compile and keep_freed_memory train, match the eager default, and refuse what cannot work."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from conftest import TableLatents, make_images, make_loader, make_models, params
from gan_accel import GANTrainer, Phase, PhaseError, PreflightError, TrainConfig, generator_loss
from gan_accel.models import DCGANDiscriminator, DCGANGenerator
from gan_accel.objectives.losses import LOSSES
from gan_accel.objectives.regularizers import r1_penalty


def train(tmp_path, name: str, G, D, images, *, accelerator=None, phases=None, fit=True, **overrides) -> GANTrainer:
    """A few steps on unshuffled data with tabled latents: runs differing only in ``overrides`` see the same numbers."""
    cfg = dict(max_steps=4, batch_size=8, z_dim=4, log_every=1, sample_every=1000, num_samples=4, warmup_ratio=0.0,
               lr_G=1e-2, lr_D=1e-2, output_dir=str(tmp_path / name), progress_bar=False)
    cfg.update(overrides)
    latents = TableLatents(4096)
    trainer = GANTrainer(G, D, make_loader(images, cfg["batch_size"]), TrainConfig(**cfg), accelerator=accelerator,
                         latent_sampler=latents, phases=phases)
    latents.rewind()
    if fit:
        trainer.fit()
    return trainer


def small_dcgan() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    return (DCGANGenerator(z_dim=4, width=4, image_size=28).double(),
            DCGANDiscriminator(width=4, image_size=28).double())


def reset() -> None:
    from conftest import reset_accelerate_state

    reset_accelerate_state()


def test_channels_last_trains_convolutions_in_channels_last_and_matches_the_default(tmp_path):
    images = make_images(64, dtype=torch.float64).repeat(1, 1, 7, 7)  # 28x28
    eager = train(tmp_path, "eager", *small_dcgan(), images)
    reset()
    fast = train(tmp_path, "channels_last", *small_dcgan(), images, channels_last=True)
    conv_weights = [p for net in (fast.G, fast.D) for p in net.parameters() if p.dim() == 4]
    assert conv_weights and all(p.is_contiguous(memory_format=torch.channels_last) for p in conv_weights)
    for net in ("G", "D"):
        for (key, a), (_, b) in zip(params(eager.networks[net]).items(), params(fast.networks[net]).items()):
            torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9, msg=f"{net}.{key}")
    assert fast.last_metrics["loss/D"] == pytest.approx(eager.last_metrics["loss/D"], rel=1e-9)


@pytest.mark.parametrize("conditional", [False, True], ids=["dcgan", "projection"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["plain", "channels_last"])
def test_a_double_backward_gives_every_gradient_its_weights_strides_and_the_same_values(conditional, channels_last):
    """A weight with a dimension of size 1 (D's 1-channel first convolution, the projection D's linear layer to one
    logit) takes a gradient whose strides differ on that dimension from R1's double backward (and under channels_last
    from any backward): DDP's bucket view, with the weight's strides, would warn ('Grad strides do not match') and
    copy it every step. The gradients must have the weights' strides and the values of the networks left as built."""
    from types import SimpleNamespace

    from gan_accel.engine.speed import apply_memory_format
    from gan_accel.models import ProjectionDiscriminator

    grads = []
    for prepared in (False, True):
        torch.manual_seed(0)
        D = (ProjectionDiscriminator(3, width=4) if conditional else DCGANDiscriminator(width=4)).double()
        if prepared:
            apply_memory_format({"D": D}, SimpleNamespace(channels_last=channels_last))
        x = make_images(8, dtype=torch.float64).repeat(1, 1, 7, 7).requires_grad_(True)
        logits = D(x, torch.arange(8) % 3) if conditional else D(x)
        (gradient,) = torch.autograd.grad(logits.sum(), x, create_graph=True)
        gradient.pow(2).sum().backward()
        grads.append({name: p.grad for name, p in D.named_parameters()})
        if prepared:
            mismatched = [(n, p.stride(), p.grad.stride()) for n, p in D.named_parameters()
                          if p.grad is not None and p.grad.stride() != p.stride()]
            assert not mismatched, mismatched
    for name, plain in grads[0].items():
        assert (plain is None) == (grads[1][name] is None), name
        if plain is not None:
            torch.testing.assert_close(grads[1][name], plain, rtol=1e-12, atol=1e-12, msg=name)
    if channels_last and not conditional:  # the case the hook is for: the weight's strides are not the plain ones
        weight = D.net[0].weight
        assert weight.shape[1] == 1 and weight.stride() != torch.empty(weight.shape).stride()


@pytest.fixture
def traced_without_codegen(monkeypatch):
    """The engine's torch.compile with the ``aot_eager`` backend: dynamo and AOT autograd decide graph breaks,
    hooks and the traced graph's autograd (what the engine's wiring depends on); inductor only generates the
    kernels: minutes of C++ compilation on a small CPU with a cold cache. The engine compiles with inductor in
    ``benchmarks/run.py --quick`` (its options section, tests/test_benchmarks.py)."""
    import functools

    from gan_accel.engine import speed

    monkeypatch.setattr(speed.torch, "compile", functools.partial(torch.compile, backend="aot_eager"))


@pytest.mark.slow  # dynamo tracing
@pytest.mark.parametrize("penalty", [dict(r1_gamma=1.0, r1_every=2), dict(loss="wasserstein", gp_weight=10.0)],
                         ids=["lazy_r1_phase", "gradient_penalty_in_D"])
def test_compile_trains_g_and_d_compiled_runs_double_backward_phases_eagerly_and_matches_eager(tmp_path, penalty,
                                                                                               traced_without_codegen):
    images = make_images(64, dtype=torch.float64)
    eager = train(tmp_path, "eager", *make_models(0), images, **penalty)
    reset()
    compiled = train(tmp_path, "compiled", *make_models(0), images, compile=True, **penalty)
    runner_nets = compiled.runner.nets
    assert all(type(runner_nets[n]).__name__ == "OptimizedModule" for n in ("G", "D"))
    # The trainer's own networks stay eager: checkpoints, EMA and sampling see plain modules.
    assert not any(type(net).__name__ == "OptimizedModule" for net in compiled.networks.values())
    assert compiled.d_step == eager.d_step == 4
    for net in ("G", "D"):
        for (key, a), (_, b) in zip(params(eager.networks[net]).items(), params(compiled.networks[net]).items()):
            torch.testing.assert_close(b, a, rtol=1e-7, atol=1e-9, msg=f"{net}.{key}")


@pytest.mark.slow
def test_compile_refuses_a_phase_taking_input_gradients_without_double_backward_flag(tmp_path, traced_without_codegen):
    images = make_images(64, dtype=torch.float64)
    loss = LOSSES["nonsaturating"]
    unflagged = [Phase("D", "D", r1_penalty(1.0), new_data=True), Phase("G", "G", generator_loss(loss))]
    trainer = train(tmp_path, "run", *make_models(0), images, phases=unflagged, compile=True, fit=False)
    with pytest.raises(PhaseError, match=r"phase 'D' takes input gradients .* double_backward=True.* compile=False"):
        trainer.fit()


def test_compile_with_an_accelerator_that_compiles_too_is_refused_before_training(tmp_path):
    images = make_images(64, dtype=torch.float64)
    with pytest.raises(PreflightError, match="compile=True and the Accelerator's dynamo_backend='EAGER' both compile"):
        train(tmp_path, "run", *make_models(0), images, accelerator=Accelerator(dynamo_backend="eager"),
              compile=True, fit=False)


def test_an_accelerator_that_compiles_is_refused_with_a_double_backward_phase(tmp_path):
    images = make_images(64, dtype=torch.float64)
    with pytest.raises(PreflightError, match=r"phase 'R1' needs a double backward.*TrainConfig\(compile=True\)"):
        train(tmp_path, "run", *make_models(0), images, accelerator=Accelerator(dynamo_backend="eager"),
              r1_gamma=1.0, r1_every=2, fit=False)


def test_optimizers_are_stepped_directly_without_a_scaler_and_match_accelerates_wrapper(tmp_path, monkeypatch):
    """Without fp16's GradScaler the runner calls the torch optimizer's step()/zero_grad() itself (Accelerate's
    wrapper adds only package lookups there); the weights are bitwise those of a run through the wrapper."""
    from accelerate.optimizer import AcceleratedOptimizer

    from gan_accel.engine import runner as runner_module

    images = make_images(64, seed=3).repeat(1, 1, 7, 7)  # 28x28
    wrapper_steps = []
    original = AcceleratedOptimizer.step
    monkeypatch.setattr(AcceleratedOptimizer, "step", lambda self, *a, **k: (wrapper_steps.append(1), original(self, *a, **k))[1])
    direct = train(tmp_path, "direct", *small_dcgan(), images)
    assert wrapper_steps == []  # every update went to the torch optimizer itself
    assert all(stepper is opt.optimizer for stepper, opt in
               zip(direct.runner._steppers.values(), direct.runner.optimizers.values()))
    reset()
    monkeypatch.setattr(runner_module, "direct_stepper", lambda accelerator, optimizer: optimizer)
    wrapped = train(tmp_path, "wrapped", *small_dcgan(), images)
    assert len(wrapper_steps) == 2 * 4  # D and G, 4 steps
    for net in ("G", "D"):
        a, b = params(direct.networks[net]), params(wrapped.networks[net])
        assert all(torch.equal(a[key], b[key]) for key in a)


def test_the_wrapper_is_kept_where_it_does_work():
    """fp16's GradScaler steps, unscales and skips overflows inside AcceleratedOptimizer.step: kept there."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from gan_accel.engine.runner import direct_stepper

    inner = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    wrapper = SimpleNamespace(optimizer=inner)
    plain = SimpleNamespace(scaler=None, distributed_type=DistributedType.NO)
    assert direct_stepper(plain, wrapper) is inner
    assert direct_stepper(SimpleNamespace(scaler=object(), distributed_type=DistributedType.NO), wrapper) is wrapper
    assert direct_stepper(SimpleNamespace(scaler=None, distributed_type=DistributedType.XLA), wrapper) is wrapper
    assert direct_stepper(plain, inner) is inner  # not wrapped at all


def test_schedulers_are_ticked_directly_on_one_process_and_match_accelerates_wrapper(tmp_path, monkeypatch):
    """On one process without a GradScaler the runner ticks the inner scheduler itself; the learning rates
    of every step and the weights are those of a run ticked through AcceleratedScheduler.step."""
    from accelerate.scheduler import AcceleratedScheduler

    from gan_accel.callbacks.metrics_log import read_metrics
    from gan_accel.engine import runner as runner_module

    images = make_images(64, seed=3).repeat(1, 1, 7, 7)  # 28x28
    ticks = []
    original = AcceleratedScheduler.step
    monkeypatch.setattr(AcceleratedScheduler, "step", lambda self, *a, **k: (ticks.append(1), original(self, *a, **k))[1])
    schedule = dict(max_steps=6, warmup_ratio=0.5)  # warmup, then a linear decay: every tick moves the lr
    direct = train(tmp_path, "direct", *small_dcgan(), images, **schedule)
    assert ticks == []
    reset()
    monkeypatch.setattr(runner_module, "scheduler_stepper", lambda accelerator, scheduler: scheduler.step)
    wrapped = train(tmp_path, "wrapped", *small_dcgan(), images, **schedule)
    assert len(ticks) == 2 * 6
    lrs = [[(row["lr/D"], row["lr/G"]) for row in read_metrics(str(tmp_path / name / "metrics.jsonl"))] for name in ("direct", "wrapped")]
    assert lrs[0] == lrs[1] and len(lrs[0]) == 6 and all(a != b for a, b in zip(lrs[0], lrs[0][1:]))
    for net in ("G", "D"):
        a, b = params(direct.networks[net]), params(wrapped.networks[net])
        assert all(torch.equal(a[key], b[key]) for key in a)
        assert direct.schedulers[net].state_dict() == wrapped.schedulers[net].state_dict()


@pytest.mark.parametrize("processes,flags,expected_epochs", [
    (1, {}, 3), (2, {}, 6), (2, {"split_batches": True}, 3), (2, {"step_with_optimizer": False}, 3),
], ids=["one-process", "two-processes", "split-batches", "not-with-optimizer"])
def test_the_scheduler_ticks_as_accelerates_wrapper_after_a_kept_step(processes, flags, expected_epochs):
    """Three updates tick the inner scheduler as AcceleratedScheduler.step does after kept optimizer
    steps (once per process, once with split_batches or without step_scheduler_with_optimizer), with
    or without an fp16 scaler: the engine's ticker never asks whether the step was skipped."""
    from types import SimpleNamespace

    from gan_accel.engine.schedules import scheduler_stepper

    for scaler in (None, object()):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
        inner = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: 1.0 / (1 + t))
        wrapped = SimpleNamespace(scheduler=inner, step=None, **(dict(step_with_optimizer=True, split_batches=False) | flags))
        tick = scheduler_stepper(SimpleNamespace(num_processes=processes, scaler=scaler), wrapped)
        for _ in range(3):
            tick()
        assert inner.last_epoch == expected_epochs
        assert optimizer.param_groups[0]["lr"] == pytest.approx(1.0 / (1 + expected_epochs))


def test_a_one_cycle_schedule_stops_at_its_total_steps_as_under_the_wrapper():
    """OneCycleLR raises past total_steps; Accelerate's wrapper stops there (two processes tick twice per
    update, so a schedule written for one process ends early) and the engine's ticker does the same."""
    from types import SimpleNamespace

    from gan_accel.engine.schedules import scheduler_stepper

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=4)
    wrapped = SimpleNamespace(scheduler=one_cycle, step=None, step_with_optimizer=True, split_batches=False)
    tick = scheduler_stepper(SimpleNamespace(num_processes=2, scaler=None), wrapped)
    for _ in range(5):
        tick()  # 10 ticks asked, OneCycleLR would raise past its 4th
    assert one_cycle._step_count == 5 and one_cycle.last_epoch == 4
    unprepared = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: 1.0)
    assert scheduler_stepper(SimpleNamespace(num_processes=1, scaler=None), unprepared) == unprepared.step


def _train_twice_with_and_without_keeping_freed_memory() -> None:
    """In a fresh process (the setting is process-wide): a run, then the same run with keep_freed_memory."""
    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    with tempfile.TemporaryDirectory() as tmp:
        images = make_images(64, seed=3).repeat(1, 1, 7, 7)
        said = []
        default = train(Path(tmp), "default", *small_dcgan(), images)
        reset()
        kept = train(Path(tmp), "kept", *small_dcgan(), images, keep_freed_memory=True)
        from gan_accel.engine.speed import keep_freed_memory
        from gan_accel import TrainConfig as Config
        applied = keep_freed_memory(Config(keep_freed_memory=True), said.append)
        same = all(torch.equal(a, b) for net in ("G", "D")
                   for a, b in zip(params(default.networks[net]).values(), params(kept.networks[net]).values()))
        print(f"applied={applied} said={said} bitwise_same={same}")


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_keep_freed_memory_applies_glibcs_thresholds_and_changes_no_bit_of_a_run():
    """The real mallopt, in a fresh process (it is process-wide): applied, silent, and the weights are
    bitwise those of a run without it (only where memory comes from changes)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import test_speed_options as t; t._train_twice_with_and_without_keeping_freed_memory()")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "applied=True said=[] bitwise_same=True" in out.stdout, out.stdout + out.stderr[-2000:]


def test_keep_freed_memory_sets_both_thresholds_and_says_one_line_where_it_cannot(tmp_path, monkeypatch, capsys):
    from gan_accel.engine import speed

    calls = []
    monkeypatch.setattr(speed, "_glibc_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    train(tmp_path, "kept", *small_dcgan(), make_images(64, seed=3).repeat(1, 1, 7, 7), keep_freed_memory=True)
    assert sorted(calls) == [(-3, 1 << 30), (-1, 1 << 30)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD (malloc.h)
    reset()
    calls.clear()
    train(tmp_path, "default", *small_dcgan(), make_images(64, seed=3).repeat(1, 1, 7, 7))
    assert calls == []  # off by default
    capsys.readouterr()
    for mallopt, expected in ((None, "keep_freed_memory needs Linux with glibc (its mallopt); ignored on this system"),
                              (lambda option, value: 0, "keep_freed_memory: glibc's mallopt refused the thresholds; ignored")):
        reset()
        monkeypatch.setattr(speed, "_glibc_mallopt", lambda m=mallopt: m)
        trainer = train(tmp_path, f"elsewhere{len(expected)}", *small_dcgan(), make_images(64, seed=3).repeat(1, 1, 7, 7),
                        keep_freed_memory=True)
        assert trainer.step == 4  # trained all the same
        lines = [line for line in capsys.readouterr().out.splitlines() if "keep_freed_memory" in line]
        assert lines == [f"gan_accel: {expected}"]
