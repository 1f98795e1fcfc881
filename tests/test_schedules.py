"""Learning-rate curves are counted in optimizer steps, whatever Accelerate's ticking."""

from __future__ import annotations

import pytest
import torch

from gan_accel.engine.schedules import lambda_scheduler, warmup_then_decay


def test_linear_warmup_then_decay_matches_hand_computed_values():
    # total 10, warmup 2: 0, 1/2, then (10 - s) / 8 down to 1/8 at the last step.
    curve = warmup_then_decay(10, 2)
    assert [curve(s) for s in range(10)] == pytest.approx([0, 0.5, 1, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])
    assert curve(10) == 0.0


def test_constant_schedule_holds_after_warmup():
    curve = warmup_then_decay(10, 4, "constant")
    assert [curve(s) for s in range(10)] == pytest.approx([0, 0.25, 0.5, 0.75] + [1.0] * 6)


@pytest.mark.parametrize("ticks", [2, 3, 8])
def test_ticked_scheduler_gives_the_same_lr_per_optimizer_step(ticks):
    """Accelerate calls scheduler.step() `ticks` times per optimizer step; the lr seen must not change."""
    curve = warmup_then_decay(12, 3)

    def lrs(ticks_per_step):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        sched = lambda_scheduler(opt, curve, ticks_per_step)
        seen = []
        for _ in range(12):
            seen.append(opt.param_groups[0]["lr"])
            opt.step()
            for _ in range(ticks_per_step):
                sched.step()
        return seen

    assert lrs(ticks) == lrs(1) == pytest.approx([0.1 * curve(s) for s in range(12)])
