"""Shared fixtures: Accelerate singletons reset between tests, tiny float64 networks, fixed latents."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# In-process tests train tiny networks on tiny tensors: a second intra-op thread only adds synchronisation,
# and on a machine shared with other work every OpenMP barrier waits for a descheduled thread (the one-process
# resume test took 19 s with 2 threads on a loaded 2-core machine, 3 s with 1). Launched processes get their
# own OMP_NUM_THREADS (1 in these tests), and nothing asserted depends on this process's thread count.
# GAN_ACCEL_TEST_THREADS=N gives this process N threads instead.
torch.set_num_threads(int(os.environ.get("GAN_ACCEL_TEST_THREADS", "1")))

Z_DIM = 4
IMAGE_SHAPE = (1, 4, 4)
NUM_CLASSES = 3


def reset_accelerate_state() -> None:
    """Accelerate keeps process-wide singletons; each in-process test needs a fresh Accelerator."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(autouse=True, scope="session")
def offline_digits_made_once():
    """In this process, the offline digit set of a given size and seed is rendered once per session.

    ``resolve_dataset`` renders 60,000 digits (about 4 s) every time an example runs in-process; the set
    is a pure function of (n, seed, size) (its own generator, the global RNG untouched), so every later
    call gets copies of the first result: the same bytes. ``synthetic_digits`` itself, as tests/test_data.py
    imports it, is the real function; launched processes render their own.
    """
    import gan_accel.data.mnist as mnist

    render = mnist.synthetic_digits
    made: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def once(n: int, seed: int = 0, size: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
        if (n, seed, size) not in made:
            made[(n, seed, size)] = render(n, seed=seed, size=size)
        images, labels = made[(n, seed, size)]
        return images.clone(), labels.clone()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mnist, "synthetic_digits", once)
        yield


@pytest.fixture(autouse=True)
def no_downloaded_weights(monkeypatch, tmp_path_factory):
    """An empty torch hub cache and no weights variables: a machine whose cache holds torchvision's VGG-16 or
    Inception's weights must score the tests' runs as a machine without them does (tests that want weights put
    stand-ins there)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path_factory.getbasetemp() / "torch_home"))
    for var in ("GAN_ACCEL_INCEPTION_WEIGHTS", "GAN_ACCEL_VGG16_WEIGHTS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    reset_accelerate_state()
    yield
    reset_accelerate_state()


@pytest.fixture(autouse=True)
def single_process_env(monkeypatch):
    # A test process may inherit launcher variables (e.g. when pytest itself runs under a launcher).
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"):
        monkeypatch.delenv(var, raising=False)


class TinyG(nn.Module):
    """BatchNorm-free generator: per-sample maths only, so a batch splits exactly into micro-batches."""

    def __init__(self) -> None:
        super().__init__()
        n = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
        self.net = nn.Sequential(nn.Linear(Z_DIM, 16), nn.LeakyReLU(0.2), nn.Linear(16, n), nn.Tanh())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).reshape(z.shape[0], *IMAGE_SHAPE)


class TinyD(nn.Module):
    """BatchNorm-free discriminator returning one logit per image."""

    def __init__(self) -> None:
        super().__init__()
        n = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(n, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).reshape(x.shape[0])


class TinyCondG(nn.Module):
    """G(z, y): the label's embedding joined to the latent; per-sample maths only."""

    def __init__(self) -> None:
        super().__init__()
        n = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
        self.embed = nn.Embedding(NUM_CLASSES, 3)
        self.net = nn.Sequential(nn.Linear(Z_DIM + 3, 16), nn.LeakyReLU(0.2), nn.Linear(16, n), nn.Tanh())

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, self.embed(y)], dim=1)).reshape(z.shape[0], *IMAGE_SHAPE)


class TinyCondD(nn.Module):
    """D(x, y) with a projection term: a label paired with the wrong image changes the logit."""

    def __init__(self) -> None:
        super().__init__()
        n = IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(n, 16), nn.LeakyReLU(0.2))
        self.psi = nn.Linear(16, 1)
        self.embed = nn.Embedding(NUM_CLASSES, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor, all_classes: bool = False) -> torch.Tensor:
        h = self.features(x)
        if all_classes:  # the logit for every class (a class loss uses it)
            return self.psi(h) + h @ self.embed.weight.t()
        return self.psi(h).reshape(x.shape[0]) + (self.embed(y) * h).sum(dim=1)


def make_models(seed: int = 0, dtype: torch.dtype = torch.float64,
                conditional: bool = False) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    if conditional:
        return TinyCondG().to(dtype), TinyCondD().to(dtype)
    return TinyG().to(dtype), TinyD().to(dtype)


def make_labels(n: int, seed: int = 2) -> torch.Tensor:
    return torch.randint(NUM_CLASSES, (n,), generator=torch.Generator().manual_seed(seed))


def make_images(n: int, seed: int = 1, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(n, *IMAGE_SHAPE, generator=generator, dtype=dtype) * 2 - 1)


def make_loader(images: torch.Tensor, batch_size: int, labels: torch.Tensor | None = None) -> DataLoader:
    """Unshuffled, so batch i is images[i*b:(i+1)*b] for any batch size (and any process split);
    with ``labels``, batches are (images, labels) pairs."""
    dataset = TensorDataset(images) if labels is None else TensorDataset(images, labels)
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, drop_last=True)


class _Table:
    """Values read in order from a fixed table: call c on process r of W gets the r-th slice of row c.

    The same table therefore feeds one process with batch W*b and W processes with batch b
    identically, and k micro-batches of b the same as one batch of k*b (rows are consumed in order).
    """

    flat: torch.Tensor

    def __init__(self) -> None:
        self.cursor = 0

    def rewind(self):
        """Start again at row 0 (the trainer's preflight draws once before training)."""
        self.cursor = 0
        return self

    def take(self, batch_size: int) -> torch.Tensor:
        """This process's slice of the next ``batch_size * num_processes`` rows."""
        from accelerate import PartialState

        state = PartialState()
        world, rank = state.num_processes, state.process_index
        chunk = self.flat[self.cursor : self.cursor + batch_size * world]
        if chunk.shape[0] < batch_size * world:
            raise RuntimeError("table exhausted: make it larger")
        self.cursor += batch_size * world
        return chunk[rank * batch_size : (rank + 1) * batch_size]


class TableLatents(_Table):
    """G's latents from a fixed table (see :class:`_Table`)."""

    def __init__(self, rows: int, dtype: torch.dtype = torch.float64, seed: int = 7) -> None:
        super().__init__()
        self.flat = torch.randn(rows, Z_DIM, generator=torch.Generator().manual_seed(seed), dtype=dtype)

    def __call__(self, batch_size: int, device: torch.device) -> torch.Tensor:
        return self.take(batch_size).to(device)


class TableLabels(_Table):
    """G's labels from a fixed table (see :class:`_Table`)."""

    def __init__(self, rows: int = 8192, seed: int = 5) -> None:
        super().__init__()
        self.flat = torch.randint(NUM_CLASSES, (rows,), generator=torch.Generator().manual_seed(seed))

    def __call__(self, batch_size: int, device: torch.device) -> torch.Tensor:
        return self.take(batch_size).to(device)


class TableEpsilon(_Table):
    """GP mixing weights from a fixed table (see :class:`_Table`)."""

    def __init__(self, rows: int = 8192) -> None:
        super().__init__()
        self.flat = torch.rand(rows, generator=torch.Generator().manual_seed(11), dtype=torch.float64)

    def __call__(self, batch_size: int, like: torch.Tensor) -> torch.Tensor:
        return self.take(batch_size).to(like).view(batch_size, *([1] * (like.dim() - 1)))


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    from accelerate.utils import extract_model_from_parallel

    return {k: v.detach().clone().cpu() for k, v in extract_model_from_parallel(module).state_dict().items()}


def assert_close_dicts(a: dict, b: dict, atol: float, rtol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=rtol, msg=lambda m, k=key: f"{k}: {m}")


def mnist_dir() -> str | None:
    """Where real MNIST lives for tests: $GAN_ACCEL_MNIST_DIR, else the shared copy if present."""
    path = os.environ.get("GAN_ACCEL_MNIST_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    return path if os.path.isdir(os.path.join(path, "MNIST", "raw")) else None


def launch_two_processes(function, args=(), num_processes: int = 2) -> None:
    """Like ``accelerate.debug_launcher`` (real gloo DDP on CPU processes), but with *spawned* processes.

    debug_launcher forks, and a fork taken after the test process has run torch ops in its OpenMP
    thread pool can deadlock the children: a suite-order-dependent hang. Spawned processes start clean.
    ``function`` must be a module-level function of a test module (it is imported by name); every
    process runs it through :func:`run_then_exit`.
    """
    import socket
    import tempfile

    from accelerate.utils import PrepareForLaunch, patch_environment
    from torch.multiprocessing import start_processes

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # A file in a folder of its own: gloo's FileStore deletes the file once every rank has closed it.
    with tempfile.TemporaryDirectory() as rendezvous_dir, patch_environment(
        world_size=num_processes, master_addr="127.0.0.1", master_port=str(port), accelerate_mixed_precision="no",
        accelerate_debug_rdv_file=os.path.join(rendezvous_dir, "rendezvous"), accelerate_use_cpu="yes", omp_num_threads="1",
    ):
        start_processes(PrepareForLaunch(run_then_exit, debug=True), args=(function, tuple(args)),
                        nprocs=num_processes, start_method="spawn")


def run_then_exit(function, args) -> None:
    """In each launched process: the test's function, then leave the gloo group together and exit at once.

    ``os._exit`` skips the C++ static destructors, where a rank whose peer had already gone sometimes
    aborted ("terminate called without an active exception") after all its work was saved: an exit
    race, not a result of the test.
    """
    import sys

    from gan_accel.processes import leave_process_group

    function(*args)
    leave_process_group()  # a barrier, then close the gloo group on every rank alike
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a launch's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> SimpleNamespace:
    """One run of examples/dcgan_mnist.py as a script (a process of its own, as users start it) on the offline
    digits, 4 steps with evaluation every 2: out (the run folder, not to be changed: copy it first), cache
    (its $GAN_ACCEL_CACHE), stdout, stderr. tests/test_example.py checks the folder, ``gan-accel sample`` and
    ``gan-accel eval`` on it; tests/test_current_names.py its first line and a poisoned resume of a copy.

    The judge (the offline digits' classifier) is cached beforehand, trained briefly on 2,000 digits: the
    wiring is checked, not the judge's accuracy, and training it in full takes half a minute
    (tests/test_metrics.py checks that a missing judge is trained and cached, and then read back).
    """
    from gan_accel.data import synthetic_digits
    from gan_accel.eval.mnist import load_or_train_classifier

    root = tmp_path_factory.mktemp("digits")
    out, cache = root / "run", root / "cache"
    judge = cache / "offline-digits_classifier.safetensors"
    load_or_train_classifier(judge, *synthetic_digits(2000), epochs=1)
    cached = judge.read_bytes()
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", GAN_ACCEL_CACHE=str(cache))
    result = subprocess.run(
        [sys.executable, str(repo / "examples" / "dcgan_mnist.py"), "--dataset", "digits", "--data-dir",
         str(root / "nodata"), "--output-dir", str(out), "--steps", "4", "--batch-size", "8", "--width", "8",
         "--sample-every", "2", "--log-every", "2", "--no-progress", "--ema-decay", "0.9", "--eval-every", "2",
         "--eval-samples", "60"], capture_output=True, text=True, timeout=600, env=env, cwd=repo)
    assert result.returncode == 0, result.stderr[-3000:]
    assert judge.read_bytes() == cached, "the cached judge is used, not trained again"
    return SimpleNamespace(out=out, cache=cache, stdout=result.stdout, stderr=result.stderr)
