"""Distributed sample evaluation: every process featurises its share, the gather gives exactly N rows in
one-process order, so the metrics equal a one-process evaluation."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import (
    IMAGE_SHAPE,
    Z_DIM,
    launch_two_processes,
    make_images,
    make_labels,
    make_models,
    reset_accelerate_state,
)
from torch import nn

from gan_accel.eval.distributed import gather_exact, generated_features, share_of
from gan_accel.eval.frechet import frechet_distance_from_features

ODD_TOTAL = 101  # odd: 51 + 50 over two processes, so the gather pads one share
BATCH = 10  # 6 batches on rank 0, 5 on rank 1: uneven numbers of forward calls
NUM_FEATURES = 6


class TinyExtractor(nn.Module):
    """Images (N, *IMAGE_SHAPE) to features (N, 6); per-sample maths only."""

    def __init__(self) -> None:
        super().__init__()
        n = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n, NUM_FEATURES), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_extractor(seed: int = 3) -> TinyExtractor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyExtractor().double().eval()


def latents64(generator: torch.Generator, n: int) -> torch.Tensor:
    return torch.randn(n, Z_DIM, generator=generator, dtype=torch.float64)


def reference_features(G, extractor, n: int, labels=None) -> torch.Tensor:
    """The plain one-process loop: all latents from the seed, one G call, one extractor call."""
    z = latents64(torch.Generator().manual_seed(1234), n)
    with torch.no_grad():
        images = G(z) if labels is None else G(z, labels)
        return extractor(images).float()


def real_features() -> torch.Tensor:
    with torch.no_grad():
        return make_extractor()(make_images(200)).float()


# ----------------------------------------------------------------------------- share_of


@pytest.mark.parametrize("total, world", [(0, 1), (1, 1), (1, 2), (7, 2), (101, 2), (100, 4), (5, 8), (10, 3)])
def test_share_of_covers_every_index_once_contiguously(total, world):
    shares = [share_of(total, world, r) for r in range(world)]
    assert sum(len(s) for s in shares) == total
    assert [i for s in shares for i in s] == list(range(total))  # contiguous, in rank order
    assert all(s.step == 1 for s in shares)
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first total % world ranks get the extra one


def test_share_of_uneven_examples():
    assert (share_of(7, 2, 0), share_of(7, 2, 1)) == (range(4), range(4, 7))
    assert (share_of(1, 2, 0), share_of(1, 2, 1)) == (range(1), range(1, 1))
    assert [share_of(10, 3, r) for r in range(3)] == [range(4), range(4, 7), range(7, 10)]


@pytest.mark.parametrize("args, error", [
    ((-1, 2, 0), ValueError), ((4, 0, 0), ValueError), ((4, 2, 2), ValueError), ((4, 2, -1), ValueError),
    ((4.0, 2, 0), TypeError), ((4, 2, True), TypeError), ((4, "2", 0), TypeError),
])
def test_share_of_rejects_bad_inputs(args, error):
    with pytest.raises(error):
        share_of(*args)


# ----------------------------------------------------------------------------- one process


def test_one_process_gather_exact_returns_rows_and_checks_count():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    rows = torch.arange(14, dtype=torch.float32).reshape(7, 2)
    assert torch.equal(gather_exact(accelerator, rows, 7), rows)
    with pytest.raises(ValueError, match=r"passed 6 rows.*has 7 rows"):
        gather_exact(accelerator, rows[:6], 7)


def test_one_process_features_match_plain_loop_and_leave_state_alone():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    G, _ = make_models(0)
    G.train()
    extractor = make_extractor()
    rng_before = torch.random.get_rng_state()
    feats = generated_features(accelerator, G, extractor, ODD_TOTAL, latents=latents64, batch_size=BATCH)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "the global RNG must not be used"
    assert G.training and all(m.training for m in G.modules()), "G's train mode must be restored"
    assert feats.shape == (ODD_TOTAL, NUM_FEATURES) and feats.dtype == torch.float32
    torch.testing.assert_close(feats, reference_features(G, extractor, ODD_TOTAL), atol=1e-6, rtol=1e-6)
    # The batch size only splits the work.
    again = generated_features(accelerator, G, extractor, ODD_TOTAL, latents=latents64, batch_size=ODD_TOTAL)
    torch.testing.assert_close(again, feats, atol=1e-6, rtol=1e-6)


def test_default_latents_are_seeded_randn():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    G, _ = make_models(0, dtype=torch.float32)
    extractor = make_extractor().float()
    feats = generated_features(accelerator, G, extractor, 9, z_dim=Z_DIM, seed=5, batch_size=4)
    z = torch.randn(9, Z_DIM, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(feats, extractor(G(z)), atol=1e-6, rtol=1e-6)


def test_mode_restored_after_error_and_bad_arguments_rejected():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    G, _ = make_models(0)
    G.train()

    def broken(images):
        raise RuntimeError("extractor failed")

    with pytest.raises(RuntimeError, match="extractor failed"):
        generated_features(accelerator, G, broken, 5, latents=latents64)
    assert all(m.training for m in G.modules())
    with pytest.raises(ValueError, match="z_dim"):
        generated_features(accelerator, G, make_extractor(), 5)
    with pytest.raises(ValueError, match="labels must have 5 rows"):
        generated_features(accelerator, G, make_extractor(), 5, z_dim=Z_DIM, labels=make_labels(4))
    with pytest.raises(ValueError, match="must return 5 rows"):
        generated_features(accelerator, G, make_extractor(), 5, latents=lambda g, n: latents64(g, n - 1))


# ----------------------------------------------------------------------------- two processes


def _fails_on_rank1(images: torch.Tensor) -> torch.Tensor:
    from accelerate import PartialState

    if PartialState().process_index == 1:
        raise RuntimeError("extractor broke on rank 1")
    return make_extractor()(images)


def _two_process_run(out_dir: str) -> None:
    """Runs on every process of two; each rank saves what it got."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    G, _ = make_models(0)
    cond_G, _ = make_models(0, conditional=True)
    G, cond_G = accelerator.prepare(G, cond_G)  # DDP-wrapped, as in a training run
    extractor = make_extractor()
    rng_before = torch.random.get_rng_state()
    result = {
        "world": accelerator.num_processes,
        "ddp": type(G).__name__,
        "plain": generated_features(accelerator, G, extractor, ODD_TOTAL, latents=latents64, batch_size=BATCH),
        "conditional": generated_features(accelerator, cond_G, extractor, ODD_TOTAL, latents=latents64,
                                          labels=make_labels(ODD_TOTAL), batch_size=BATCH),
        # One sample over two processes: rank 1's share is empty.
        "single": generated_features(accelerator, G, extractor, 1, latents=latents64, batch_size=BATCH),
    }
    result["rng_untouched"] = torch.equal(torch.random.get_rng_state(), rng_before)
    result["training"] = G.training
    # Rows of known content: 7 over two processes (4 + 3), and 1 (1 + 0, rank 1 passing a 0-row tensor).
    seven = torch.arange(14, dtype=torch.float64).reshape(7, 2)
    result["seven"] = gather_exact(accelerator, seven[share_of(7, 2, rank).start:share_of(7, 2, rank).stop], 7)
    result["one"] = gather_exact(accelerator, seven[:1] if rank == 0 else torch.empty(0), 1)
    # A wrong row count on rank 1 only: both ranks must raise (and neither hang in the gather).
    try:
        gather_exact(accelerator, torch.zeros(4 if rank == 0 else 2, 2), 7)
        result["mismatch"] = None
    except ValueError as error:
        result["mismatch"] = str(error)
    # An error while generating on rank 1 only: both ranks raise instead of rank 0 waiting in the gather.
    try:
        generated_features(accelerator, G, _fails_on_rank1, ODD_TOTAL, latents=latents64, batch_size=BATCH)
        result["failure"] = None
    except Exception as error:
        result["failure"] = f"{type(error).__name__}: {error}"
    # The evaluator's scoring: the main process decides, and its error is raised on every process (not the others
    # waiting in a broadcast while it gathers an error report).
    from gan_accel.processes import main_decides

    def broken_scores() -> dict:
        raise ValueError("scoring broke on the main process")

    result["decided"] = main_decides(accelerator, lambda: {"fid": 1.5, "rank": rank})
    try:
        main_decides(accelerator, broken_scores)
        result["main_failure"] = None
    except Exception as error:
        result["main_failure"] = f"{type(error).__name__}: {error}"
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval_two")
    launch_two_processes(_two_process_run, args=(str(out),), num_processes=2)
    return [torch.load(out / f"rank{r}.pt") for r in (0, 1)]


@pytest.mark.slow
def test_two_processes_gather_exactly_n_rows_equal_to_one_process(two_processes):
    from accelerate import Accelerator

    rank0, rank1 = two_processes
    assert rank0["world"] == 2 and rank0["ddp"] == "DistributedDataParallel"
    assert rank0["rng_untouched"] and rank1["rng_untouched"] and rank0["training"]
    two = rank0["plain"]
    assert two.shape == (ODD_TOTAL, NUM_FEATURES)
    assert torch.equal(rank1["plain"], two), "every process must get the same rows"
    assert torch.unique(two, dim=0).shape[0] == ODD_TOTAL, "no duplicated (padding) rows"

    reset_accelerate_state()
    G, _ = make_models(0)
    extractor = make_extractor()
    one = generated_features(Accelerator(cpu=True), G, extractor, ODD_TOTAL, latents=latents64, batch_size=BATCH)
    # Row for row (a misplaced row would be off by O(1)); not bitwise: a row's batch starts elsewhere on 2
    # processes (rank 1 from row 51), a GEMM may round a row by its position in the batch, and the float64
    # features are returned as float32, where such a difference can flip the last bit.
    torch.testing.assert_close(two, one, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(two, reference_features(G, extractor, ODD_TOTAL), atol=1e-6, rtol=1e-6)

    real = real_features()
    assert frechet_distance_from_features(two, real) == pytest.approx(frechet_distance_from_features(one, real),
                                                                      rel=1e-6)


@pytest.mark.slow
def test_two_processes_conditional_keeps_labels_with_their_latents(two_processes):
    from accelerate import Accelerator

    rank0, rank1 = two_processes
    two = rank0["conditional"]
    assert two.shape == (ODD_TOTAL, NUM_FEATURES) and torch.equal(rank1["conditional"], two)
    reset_accelerate_state()
    G, _ = make_models(0, conditional=True)
    extractor, labels = make_extractor(), make_labels(ODD_TOTAL)
    one = generated_features(Accelerator(cpu=True), G, extractor, ODD_TOTAL, latents=latents64, labels=labels,
                             batch_size=BATCH)
    torch.testing.assert_close(two, one, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(two, reference_features(G, extractor, ODD_TOTAL, labels), atol=1e-6, rtol=1e-6)
    # The labels matter: another labelling gives other features.
    assert not torch.allclose(two, reference_features(G, extractor, ODD_TOTAL, (labels + 1) % 3))


@pytest.mark.slow
def test_two_processes_uneven_and_empty_shares_and_mismatch(two_processes):
    rank0, rank1 = two_processes
    seven = torch.arange(14, dtype=torch.float64).reshape(7, 2)
    for result in (rank0, rank1):
        assert torch.equal(result["seven"], seven)
        assert torch.equal(result["one"], seven[:1])
        assert result["single"].shape == (1, NUM_FEATURES)
        assert result["mismatch"] is not None and "process 1 passed 2 rows" in result["mismatch"]
        assert "has 3 rows" in result["mismatch"]
        assert result["failure"] is not None and "extractor broke on rank 1" in result["failure"]
    G, _ = make_models(0)
    torch.testing.assert_close(rank0["single"], reference_features(G, make_extractor(), 1), atol=1e-6, rtol=1e-6)
    # Latents depend on N (not on the process count): torch draws randn(1) and randn(101)[:1] differently.


@pytest.mark.slow
def test_two_processes_take_the_main_process_scores_and_its_error(two_processes):
    assert [r["decided"] for r in two_processes] == [{"fid": 1.5, "rank": 0}] * 2
    assert two_processes[0]["main_failure"] == "ValueError: scoring broke on the main process"
    assert "scoring broke on the main process" in two_processes[1]["main_failure"]
