"""RunningMeans: folded sums equal a hand-computed mean, survive a checkpoint mid-fold, read old checkpoints."""

import torch

from gan_accel.engine.running_means import FOLD, RunningMeans


class OneProcess:
    """The single-process accelerator's reduce: the local values themselves."""

    def reduce(self, tensor, reduction="mean"):
        return tensor


def observations(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=g)
    keeps = torch.rand(n, generator=g) > 0.3
    return values, keeps


def test_means_over_several_folds_equal_a_hand_computed_mean():
    n = 3 * FOLD + 17  # three folds and a pending rest
    values, keeps = observations(n)
    means = RunningMeans()
    loss = torch.zeros((), requires_grad=True)
    for v, k in zip(values, keeps):
        means.add("loss", loss + v)  # a graph output, as the engine logs losses
        means.add("norm", v, keep=k)
    out = means.reduce(OneProcess())
    assert abs(out["loss"] - values.double().mean().item()) < 1e-5
    assert abs(out["norm"] - values.double()[keeps].mean().item()) < 1e-5
    assert means.reduce(OneProcess()) == {}  # cleared


def test_a_resumed_instance_reduces_to_the_very_same_means():
    values, keeps = observations(2 * FOLD + 9, seed=1)
    for cut in (5, FOLD, FOLD + 3):
        whole, first = RunningMeans(), RunningMeans()
        for i, (v, k) in enumerate(zip(values, keeps)):
            whole.add("a", v.clone())
            whole.add("b", v.clone(), keep=k)
            if i < cut:
                first.add("a", v.clone())
                first.add("b", v.clone(), keep=k)
        resumed = RunningMeans()
        resumed.load_state_dict(first.state_dict(), torch.device("cpu"))
        for v, k in list(zip(values, keeps))[cut:]:
            resumed.add("a", v.clone())
            resumed.add("b", v.clone(), keep=k)
        assert resumed.reduce(OneProcess()) == whole.reduce(OneProcess()), cut  # bitwise: same folds, same order



def test_a_buffer_changed_in_place_after_logging_keeps_its_logged_value():
    buffer, means = torch.zeros(()), RunningMeans()
    for step in range(4):
        buffer.fill_(float(step))
        means.add("buffer", buffer)
    assert means.reduce(OneProcess()) == {"buffer": 1.5}
