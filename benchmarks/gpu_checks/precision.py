"""Sections on precision and non-finite values: fp16 (one GradScaler, two optimizers, a forced overflow,
a plain twin with its own scaler), bf16 autocast, R1 and WGAN-GP under fp16 against closed forms, and the
divergence guard on the device."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

from .fixtures import (LinearD, RecordUpdates, Run, TableLatents, TinyG, Z_TINY, cpu_state, digit_images, first_conv,
                       fp16_accelerator, identical, loader, make_trainer, max_diff, metric_rows, moved,
                       proof_mode, small_dcgan, tiny_images, tiny_models)
from .report import Report, Section, Skip


# -- fp16: one GradScaler, two optimizers ---------------------------------------------------------------
class ScaledGradient(torch.autograd.Function):
    """Identity forward (the loss stays finite: the divergence guard does not see it), backward x ``factor``:
    1e38 overflows the scaled gradients whatever the precision, as an fp16 overflow does; NaN poisons them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def d_loss_modified(changes: dict[int, str], onwards: bool = False) -> list:
    """The default phases, with D's loss changed at the steps (0-based) of ``changes`` (with ``onwards``, at
    every step from the first of them): "overflow" (finite loss, overflowing gradients), "nan_loss" (+ NaN),
    "nan_grad" (NaN gradients)."""
    from gan_accel import Phase, discriminator_loss, generator_loss
    from gan_accel.objectives.losses import LOSSES

    loss = LOSSES["nonsaturating"]
    d_loss = discriminator_loss(loss)
    first = min(changes)

    def modified(ctx: Any) -> torch.Tensor:
        value = d_loss(ctx)
        how = changes[first] if onwards and ctx.step >= first else changes.get(ctx.step)
        if how == "overflow":
            return ScaledGradient.apply(value, 1e38)
        if how == "nan_loss":
            return value + float("nan")
        if how == "nan_grad":
            return ScaledGradient.apply(value, float("nan"))
        return value

    return [Phase("D", "D", modified, new_data=True), Phase("G", "G", generator_loss(loss))]


def _fp16_overflow_run(run: Run, optimizer: str, width: int, steps: int, at: int) -> tuple[Any, RecordUpdates]:
    G, D = small_dcgan(width)
    extra = {}
    if optimizer == "foreach":
        extra = dict(opt_G=torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999), foreach=True),
                     opt_D=torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999), foreach=True))
    record = RecordUpdates()
    trainer = make_trainer(run, f"fp16_overflow_{optimizer}", G, D, loader(digit_images(8 * steps), 8),
                           latents=TableLatents(8, dtype=torch.float32), callbacks=(record,), max_steps=steps,
                           mixed_precision="fp16", lr_G=1e-3, lr_D=1e-3, lr_schedule="linear", z_dim=8,
                           accelerator=fp16_accelerator(run, init_scale=256.0), phases=d_loss_modified({at: "overflow"}),
                           **extra)
    record.start(trainer)
    trainer.fit()
    return trainer, record


def sec_fp16(run: Run, s: Section, report: Report) -> None:
    width, steps, at = run.size(16, 4), 6, 2
    s.note("CUDA: fp16 autocast and Accelerate's GradScaler." if run.cuda else
           "CPU: Accelerate turns fp16 off on CPU (no autocast, no scaler); here fp16 autocast (which CPU supports) "
           "and a CPU GradScaler are switched on, so the engine's fp16 paths (shared scaler, per-optimizer unscale, "
           "scaler skips, Accelerate's optimizer and scheduler wrappers) run as on a GPU, on CPU kernels.")
    s.note(f"Forced overflow: D's loss backward x 1e38 at step {at} only (the loss itself stays finite, so only the "
           "GradScaler can see it); DCGAN with BatchNorm, linear lr decay, GradScaler init_scale 256 (so that no other "
           "update overflows by itself), growth_interval 2000 (no growth in 6 steps).")
    with proof_mode(run):
        trainer, record = _fp16_overflow_run(run, "fused", width, steps, at)
    _check_overflow(s, trainer, record, at, "fused Adam (the default)")
    rows = metric_rows(trainer)
    s.number("loss_scale per row", [r.get("loss_scale") for r in rows])
    counted = rows[-1].get("skipped_fp16/D") if rows else None
    s.check("the overflow skip is counted (skipped_fp16/D = 1, skipped_fp16/G = 0 in the last row)",
            counted == 1 and rows[-1].get("skipped_fp16/G") == 0, f"last row: skipped_fp16/D = {counted}")
    fused_ticks = record.of("D")[at]["ticks"] - record.of("D")[at - 1]["ticks"]
    with proof_mode(run):
        trainer_f, record_f = _fp16_overflow_run(run, "foreach", width, steps, at)
    _check_overflow(s, trainer_f, record_f, at, "foreach Adam (passed by the user)")
    foreach_ticks = record_f.of("D")[at]["ticks"] - record_f.of("D")[at - 1]["ticks"]
    s.number("D scheduler ticks on the skipped update: fused / foreach Adam", [fused_ticks, foreach_ticks])
    s.check("a skipped fp16 update uses up its step of the schedule, whatever the optimizer (as a guard skip does)",
            fused_ticks == foreach_ticks == 1, f"fused Adam: {fused_ticks} tick, foreach Adam: {foreach_ticks}")
    _fp16_twin(run, s, width)
    s.number("summary", f"overflow skipped exactly D@{at}; scheduler ticks fused/foreach {fused_ticks}/{foreach_ticks}; "
             f"twin max |diff| {s.numbers.get('twin max |diff|', float('nan')):.1e}")


def _check_overflow(s: Section, trainer: Any, record: RecordUpdates, at: int, label: str) -> None:
    D_rows, G_rows = record.of("D"), record.of("G")
    before_D = D_rows[at - 1]
    s.check(f"{label}: D's overflowing update skipped (weights and optimizer state bitwise unchanged)",
            identical(D_rows[at]["params"], before_D["params"]) and identical(D_rows[at]["state"], before_D["state"]))
    others = [i for i in range(len(D_rows)) if i != at]
    s.check(f"{label}: every other D update happened",
            all(moved(record.initial["D"] if i == 0 else D_rows[i - 1]["params"], D_rows[i]["params"]) for i in others))
    s.check(f"{label}: every G update happened, the one of step {at} included",
            all(moved(record.initial["G"] if i == 0 else G_rows[i - 1]["params"], G_rows[i]["params"])
                for i in range(len(G_rows))))
    # GradScaler's rule: x backoff_factor (0.5) after an update with inf/NaN gradients, x growth_factor after
    # growth_interval (2000) finite ones in a row, else unchanged. Updates in order: D0, G0, D1, G1, ...
    scales = [r["scale"] for r in record.rows]
    expected, scale = [], 256.0
    for r in record.rows:
        if r["net"] == "D" and r["step"] == at:
            scale *= 0.5
        expected.append(scale)
    s.check(f"{label}: the shared scale halves once, at D's update of step {at}, and G's update uses the halved scale",
            scales == expected, f"scales after each update: {scales}")


def _fp16_twin(run: Run, s: Section, width: int) -> None:
    steps, b, clip = 5, 8, 1.0
    images = digit_images(steps * b)
    with proof_mode(run):
        trainer = make_trainer(run, "fp16_twin", *small_dcgan(width), loader(images, b),
                               latents=TableLatents(8, dtype=torch.float32), max_steps=steps, mixed_precision="fp16",
                               lr_G=1e-3, lr_D=1e-3, lr_schedule="constant", clip_grad_norm_D=clip, z_dim=8,
                               accelerator=fp16_accelerator(run, init_scale=256.0))
        trainer.fit()
        twin = plain_dcgan_twin(run, images, b, steps, TableLatents(8, dtype=torch.float32), width, "fp16",
                                clip_D=clip, init_scale=256.0)
    diff = max(max_diff(cpu_state(trainer.G), twin["G"]), max_diff(cpu_state(trainer.D), twin["D"]))
    s.number("twin max |diff|", diff)
    s.check("fp16 run with D clipped = a plain loop with its own GradScaler (unscale D only, clip, step, update)",
            diff <= 1e-6, f"max |diff| {diff:.2e} (tolerance 1e-6; the same fp16 operations in the same order)")
    rows = metric_rows(trainer)
    logged = rows[-1]["grad_norm/D"]
    s.check("grad_norm/D is the unscaled norm", math.isclose(logged, twin["norms_D"][-1], rel_tol=1e-4),
            f"logged {logged:.6g}, the twin's after unscale_ {twin['norms_D'][-1]:.6g}")
    s.check("the twin's scale matches the engine's", rows[-1]["loss_scale"] == twin["scale"],
            f"{rows[-1]['loss_scale']} / {twin['scale']}")


def plain_dcgan_twin(run: Run, images: torch.Tensor, b: int, steps: int, latents: TableLatents, width: int,
                     precision: str, clip_D: float | None = None, init_scale: float = 256.0) -> dict:
    """The hand-written DCGAN loop under autocast (and, for fp16, its own GradScaler), fused Adam, lr 1e-3."""
    from gan_accel.objectives.losses import LOSSES

    device = run.device
    loss = LOSSES["nonsaturating"]
    G, D = small_dcgan(width)
    G.to(device), D.to(device)
    opt_G = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=True)
    opt_D = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=True)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if precision == "fp16" else None
    autocast = functools.partial(torch.autocast, device.type, dtype=dtype)
    scale = (lambda x: scaler.scale(x)) if scaler else (lambda x: x)

    def update(optimizer: torch.optim.Optimizer) -> None:  # through the scaler (which may skip it), then zero_grad
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    norms = []
    for step in range(steps):
        real = images[step * b:(step + 1) * b].to(device)
        with autocast():
            fake = G(latents(b, device))
            loss_D = loss.d_loss(D(real), D(fake.detach()))
        scale(loss_D).backward()
        if clip_D:
            if scaler:
                scaler.unscale_(opt_D)
            norms.append(float(torch.nn.utils.clip_grad_norm_(D.parameters(), clip_D)))
        update(opt_D)
        for p in D.parameters():
            p.requires_grad_(False)
        with autocast():
            loss_G = loss.g_loss(D(fake))
        scale(loss_G).backward()
        for p in D.parameters():
            p.requires_grad_(True)
        update(opt_G)
    return {"G": cpu_state(G), "D": cpu_state(D), "norms_D": norms,
            "scale": float(scaler.get_scale()) if scaler else None}


# -- bf16 -----------------------------------------------------------------------------------------
def sec_bf16(run: Run, s: Section, report: Report) -> None:
    if run.cuda and not torch.cuda.is_bf16_supported():
        raise Skip("this GPU does not support bf16")
    width, steps, b = run.size(16, 4), 4, 8
    images = digit_images(steps * b)
    conv_dtypes: list[torch.dtype] = []
    with proof_mode(run):
        trainer = make_trainer(run, "bf16", *small_dcgan(width), loader(images, b),
                               latents=TableLatents(8, dtype=torch.float32), max_steps=steps, mixed_precision="bf16",
                               lr_G=1e-3, lr_D=1e-3, lr_schedule="constant", z_dim=8)
        # after the preflight, which calls D in fp32 outside autocast
        first_conv(trainer).register_forward_hook(lambda m, i, o: conv_dtypes.append(o.dtype))
        trainer.fit()
        twin = plain_dcgan_twin(run, images, b, steps, TableLatents(8, dtype=torch.float32), width, "bf16")
    s.check("D's convolutions ran in bf16", bool(conv_dtypes) and all(d == torch.bfloat16 for d in conv_dtypes),
            f"{len(conv_dtypes)} calls, dtypes {sorted({str(d) for d in conv_dtypes})}")
    s.check("weights stay float32", all(p.dtype == torch.float32 for p in trainer.G.parameters()))
    rows = metric_rows(trainer)
    s.check("losses finite", all(math.isfinite(r[k]) for r in rows for k in ("loss/D", "loss/G")))
    diff = max(max_diff(cpu_state(trainer.G), twin["G"]), max_diff(cpu_state(trainer.D), twin["D"]))
    s.number("twin max |diff|", diff)
    s.check("= a plain loop under torch.autocast(bf16)", diff <= 1e-6, f"max |diff| {diff:.2e} (tolerance 1e-6)")
    s.number("summary", f"bf16 autocast = plain bf16 loop, max |diff| {diff:.1e}")


# -- R1 and WGAN-GP under fp16 -------------------------------------------------------------------------
def _penalty_run(run: Run, name: str, make_loss: Callable, lr: float, magnitude: float,
                 init_scale: float | None) -> tuple[Any, torch.Tensor, float]:
    """One SGD step of D = LinearD on the penalty alone, under fp16: (trainer, w0 in float64, initial scale)."""
    from gan_accel import Phase

    w0 = (torch.rand(16, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 0.5) * magnitude
    D = LinearD(w0.float())
    w0 = D.linear.weight.detach().double().flatten().clone()  # exactly what the network starts from
    torch.manual_seed(0)
    G = TinyG()
    phase = Phase(name, "D", make_loss(), new_data=True, double_backward=True)
    with proof_mode(run):
        trainer = make_trainer(run, f"penalty_{name}", G, D, loader(tiny_images(32, torch.float32), 8), max_steps=1,
                               mixed_precision="fp16", phases=[phase], opt_D=torch.optim.SGD(D.parameters(), lr=lr),
                               accelerator=fp16_accelerator(run, init_scale=init_scale))
        scale = float(trainer.accelerator.scaler.get_scale())  # the initial scale
        trainer.fit()
    return trainer, w0, scale


def sec_penalties(run: Run, s: Section, report: Report) -> None:
    from gan_accel import gradient_penalty, r1_penalty

    s.note("D(x) = w.x + b, so grad_x D = w for every x: R1 = gamma/2 |w|^2 and its gradient gamma w; WGAN-GP = "
           "weight (|w| - 1)^2 with |w| = sqrt(sum w^2 + 1e-12) and gradient 2 weight (|w| - 1) w / |w|. One SGD step "
           "(lr known) from w0: the engine's w1 against w0 - lr x gradient, computed in float64. Under fp16 "
           "D runs in half precision, so w is rounded to fp16 (relative 2^-11): tolerance 4e-3, while a missing or "
           "doubled scale is off by the scale (2^10 here, so that nothing overflows: see the finding below).")
    cases = [("R1", lambda: r1_penalty(0.5), 0.5, 1.0, 0.05), ("GP", lambda: gradient_penalty(1.0), 1.0, 0.1, 0.1)]
    for name, make_loss, weight, lr, magnitude in cases:
        trainer, w0, scale = _penalty_run(run, name, make_loss, lr, magnitude, init_scale=2.0**10)
        w1 = trainer.accelerator.unwrap_model(trainer.D).linear.weight.detach().double().flatten().cpu()
        if name == "R1":
            value, grad = weight / 2 * w0.square().sum(), weight * w0
        else:
            norm = (w0.square().sum() + 1e-12).sqrt()
            value, grad = weight * (norm - 1) ** 2, 2 * weight * (norm - 1) * w0 / norm
        expected_step, engine_step = -lr * grad, w1 - w0
        error = ((engine_step - expected_step).abs() / expected_step.abs()).max().item()
        logged = metric_rows(trainer)[-1][f"loss/{name}"]
        s.number(f"{name}: closed form", value.item())
        s.number(f"{name}: logged loss", logged)
        s.number(f"{name}: max relative error of the update", error)
        s.check(f"{name} under fp16 (scale {scale:g}): the logged penalty is the closed form",
                math.isclose(logged, value.item(), rel_tol=4e-3), f"{logged:.6g} against {value.item():.6g}")
        s.check(f"{name} under fp16: D's update is -lr x the closed-form gradient (scaled, then unscaled once)",
                error <= 4e-3, f"max relative error {error:.2e} (tolerance 4e-3; a missing or double scale is off by "
                f"x{scale:g})")
        bias_moved = trainer.accelerator.unwrap_model(trainer.D).linear.bias.item() != 0.25
        s.check(f"{name}: D's bias gets the zero gradient the penalty gives it", not bias_moved)
    # At Accelerate's default initial scale, 2^16: autograd.grad of scaler.scale(logits.sum()) sends the scale
    # itself back into D's fp16 output as the gradient of every logit, and 65536 > fp16's largest value (65504).
    trainer, w0, scale = _penalty_run(run, "R1", lambda: r1_penalty(0.5), 1.0, 0.05, init_scale=None)
    row = metric_rows(trainer)[-1]
    skipped = trainer.guard.skipped.get("D", 0) if trainer.guard is not None else None
    s.number("R1 at Accelerate's default scale: scale, logged loss/R1, skipped/D, scale after",
             [scale, row.get("loss/R1"), skipped, row.get("loss_scale")])
    if not math.isfinite(row.get("loss/R1", math.nan)):
        s.finding("R1 and WGAN-GP overflow under fp16 whenever the loss scale is 2^16",
                  f"at Accelerate's default initial scale ({scale:g}) the R1 loss came out {row.get('loss/R1')} and the "
                  f"update was skipped (skipped/D = {skipped}, scale then {row.get('loss_scale')}). "
                  "objectives/regularizers.py scaled_input_gradients takes autograd.grad of scaler.scale(logits.sum()): "
                  "on CUDA autocast sums in fp32 and the gradient cast back into each fp16 logit is the scale itself, "
                  "and 2^16 > 65504 (fp16's largest) is inf, whatever the batch (where the sum stays fp16, as CPU "
                  "autocast keeps it, the scaled sum overflows already). So the first R1 (or every GP) update of an fp16 run is skipped, and again each "
                  "time the scaler grows back to 2^16 (every 2000 finite updates). A fix: take the input gradient of "
                  "scaler.scale(logits.sum()) / n (n the batch) and multiply it back by n, or cap the penalty's scale "
                  "at 2^15; the unscale stays exact.")
    s.number("summary", "R1 and GP under fp16 = closed forms" + ("" if not s.failed_checks else ": FAILED")
             + ("; overflow at scale 2^16 (finding)" if s.findings else ""))


# -- the divergence guard on the device ----------------------------------------------------------------
def _guard_trainer(run: Run, name: str, phases: list, precision: str = "no", **settings: Any) -> tuple[Any, RecordUpdates]:
    record = RecordUpdates()
    options = dict(max_steps=6, lr_G=1e-2, lr_D=1e-2)
    options.update(settings)
    if precision == "fp16":
        options.update(mixed_precision="fp16", accelerator=fp16_accelerator(run, init_scale=256.0))
    trainer = make_trainer(run, name, *tiny_models(torch.float32), loader(tiny_images(64, torch.float32), 4),
                           latents=TableLatents(Z_TINY, dtype=torch.float32), callbacks=(record,), phases=phases,
                           **options)
    record.start(trainer)
    return trainer, record


def _skips_of(record: RecordUpdates, net: str = "D") -> list[int]:
    """Indices of ``net``'s updates that left weights and optimizer state bitwise unchanged."""
    rows = record.of(net)
    previous = [{"params": record.initial[net], "state": None}] + rows[:-1]
    return [i for i, (before, after) in enumerate(zip(previous, rows))
            if identical(before["params"], after["params"]) and (before["state"] is None or identical(before["state"], after["state"]))]


def sec_guard(run: Run, s: Section, report: Report) -> None:
    from gan_accel import DivergenceError

    phases = d_loss_modified({2: "nan_loss", 4: "nan_grad"})
    label = "device"
    with proof_mode(run):
        trainer, record = _guard_trainer(run, "guard", phases)
        trainer.fit()
    expected_modes = {"fused": 12}
    s.check(f"{label}: skip mode {expected_modes}", trainer.runner.skippable.modes_used == expected_modes,
            f"modes used: {trainer.runner.skippable.modes_used}")
    s.check(f"{label}: exactly D's updates at steps 2 (NaN loss) and 4 (NaN gradients) skipped, bitwise "
            "(weights and Adam state)", _skips_of(record) == [2, 4] and _skips_of(record, "G") == [],
            f"skipped D updates {_skips_of(record)}, G {_skips_of(record, 'G')}")
    rows = metric_rows(trainer)
    s.check(f"{label}: skipped/D counted on the device and logged", [r["skipped/D"] for r in rows] == [0, 0, 1, 1, 2, 2],
            f"{[r['skipped/D'] for r in rows]}")
    s.check(f"{label}: weights finite", all(torch.isfinite(p).all() for p in trainer.D.parameters()))
    # DivergenceError at the first log row after max_bad_updates consecutive skips
    with proof_mode(run):
        trainer, _ = _guard_trainer(run, "diverge", d_loss_modified({1: "nan_loss"}, onwards=True), max_steps=12, log_every=5,
                                    max_bad_updates=3)
        raised = ""
        try:
            trainer.fit()
        except DivergenceError as error:
            raised = str(error)
    s.check("3 consecutive NaN updates (max_bad_updates=3): DivergenceError at the next log row (step 5)",
            "noticed at step 5" in raised and trainer.step == 5, raised.split(";")[0] or "not raised")
    # fp16: a NaN loss becomes the scaler's skip
    with proof_mode(run):
        trainer, record = _guard_trainer(run, "guard_fp16", d_loss_modified({2: "nan_loss"}), precision="fp16")
        trainer.fit()
    rows = metric_rows(trainer)
    s.check("fp16: a NaN loss is handed to the GradScaler: D's update of step 2 skipped, and only it",
            _skips_of(record) == [2] and _skips_of(record, "G") == [], f"skipped D updates {_skips_of(record)}")
    s.check("fp16: skipped/D = 1, the scale halved once", rows[-1]["skipped/D"] == 1 and rows[-1]["loss_scale"] == 128.0,
            f"skipped/D {rows[-1]['skipped/D']}, loss_scale {rows[-1]['loss_scale']}")
    s.check("fp16: skip mode 'scaler'", trainer.runner.skippable.modes_used == {"scaler": 12},
            f"{trainer.runner.skippable.modes_used}")
    s.number("summary", "NaN loss / NaN gradients skipped bitwise" + (", on the device" if run.cuda else "")
             + "; DivergenceError at the next row; fp16 via the scaler")
