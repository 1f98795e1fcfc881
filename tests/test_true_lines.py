"""Every mistake gets one true line: what went wrong, said right, with the fix; no traceback, exit 2.

Each case is one that once gave a raw traceback or a wrong diagnosis (a truncated file called a full
disk, a damaged checkpoint called one of fewer processes, a folder said to belong to itself), run the
way a user meets it: through the example script, the ``gan-accel`` command, or the trainer.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from conftest import TableLatents, make_images, make_models, reset_accelerate_state
from gan_accel import GANTrainer, PreflightError, RunFolderError, TrainConfig
from gan_accel.errors import ConfigError
from test_user_errors import TINY, load_example, one_error_line, run_main

CK2, CK4 = "checkpoint_00000002", "checkpoint_00000004"


def config(tmp_path, **overrides) -> TrainConfig:
    cfg = dict(max_steps=6, batch_size=4, z_dim=4, log_every=1, sample_every=100, num_samples=4,
               checkpoint_every=100, output_dir=str(tmp_path / "run"), progress_bar=False)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def trainer(tmp_path, loader, **overrides) -> GANTrainer:
    G, D = make_models()
    return GANTrainer(G, D, loader, config(tmp_path, **overrides), latent_sampler=TableLatents(4096))


# -- seeds ---------------------------------------------------------------------------------------------
def test_a_seed_numpy_or_torch_cannot_take_is_refused_by_the_parser_and_the_config(tmp_path, capsys):
    code, line = run_main(load_example("dcgan_mnist"), ["--seed", str(2**70), "--output-dir", str(tmp_path / "r")],
                          capsys)
    assert code == 2 and "--seed: '1180591620717411303424' is more than 2,147,483,647, the largest allowed (what numpy" in line
    for seed in (2**31, 2**70):
        with pytest.raises(ConfigError, match=f"seed={seed} is invalid: expected an integer from 0 to 2147483647"):
            config(tmp_path, seed=seed)
    config(tmp_path, seed=2**31 - 1)  # the largest: numpy takes it, plus a process index
    from gan_accel.config import MAX_SEED
    import numpy as np

    np.random.seed(MAX_SEED + 1024)  # what set_seed(seed + process index) asks of numpy: accepted


# -- the data, later in a run ----------------------------------------------------------------------------
class MixedSizes(Dataset):
    """Items 0-9 are 4x4 images, the rest 5x5."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.zeros(1, 4, 4, dtype=torch.float64) if i < 10 else torch.zeros(1, 5, 5, dtype=torch.float64)


def test_images_of_mixed_sizes_are_one_line_naming_the_batch(tmp_path):
    # Batch 3 (items 8-11) mixes the two sizes: the collate error, said as what it is.
    with pytest.raises(PreflightError, match=r"a batch of epoch 0 mixes samples of different sizes \(stack expects"):
        trainer(tmp_path, DataLoader(MixedSizes(), batch_size=4, drop_last=True)).fit()
    # Batch 4 (items 12-15) is all 5x5: a batch of another shape than the run's (D would fail on it).
    order = list(range(8)) + list(range(12, 16)) + list(range(8, 12))
    loader = DataLoader(torch.utils.data.Subset(MixedSizes(), order[:8] + order[8:12]), batch_size=4, drop_last=True)
    reset_accelerate_state()
    with pytest.raises(PreflightError, match=r"batch 3 of epoch 0 holds samples of shape \(1, 5, 5\), but the run's "
                                             r"samples are \(1, 4, 4\) \(its first batch\)"):
        trainer(tmp_path, loader, output_dir=str(tmp_path / "run2")).fit()


class OneEpochStream(IterableDataset):
    """Yields 8 images in its first epoch only: a generator read once."""

    def __init__(self):
        self.items = iter(make_images(8))

    def __iter__(self):
        return self.items


def test_an_iterable_dataset_that_runs_dry_in_a_later_epoch_says_so(tmp_path):
    with pytest.raises(PreflightError) as raised:
        trainer(tmp_path, DataLoader(OneEpochStream(), batch_size=4)).fit()
    message = str(raised.value)
    # (the preflight's look at the first batch took one of the generator's two: the run saw one)
    assert "the training data yielded no batch in epoch 1 (the one before yielded 1)" in message
    assert "an IterableDataset must start over in every epoch" in message
    assert "Batch does not contain any data" not in message


def test_three_item_batches_are_refused_as_the_docs_say(tmp_path):
    images = make_images(16)
    loader = DataLoader(TensorDataset(images, torch.zeros(16, dtype=torch.long), torch.arange(16)), batch_size=4)
    with pytest.raises(PreflightError, match=r"unsupported batch: a list of 3 items.*\(x, labels\) tuple/list.*"
                                             "drop the other items"):
        trainer(tmp_path, loader)
    # one item ([x], what TensorDataset(images) yields) and two stay accepted
    trainer(tmp_path, DataLoader(TensorDataset(images), batch_size=4), max_steps=1).fit()


# -- networks -----------------------------------------------------------------------------------------------
def test_d_registered_again_as_an_extra_network_is_named_as_such(tmp_path):
    G, D = make_models()
    loader = DataLoader(TensorDataset(make_images(16)), batch_size=4)
    with pytest.raises(PreflightError, match="network 'E' is D itself \\(the same module, registered twice\\)"):
        GANTrainer(G, D, loader, config(tmp_path), extra_networks={"E": D})
    head = nn.Sequential(D.net[0], D.net[1])  # a sub-module of D: its parameters are D's
    with pytest.raises(PreflightError, match="network 'E' shares the trainable parameter '1.weight' with network 'D'"):
        GANTrainer(G, D, loader, config(tmp_path), extra_networks={"E": head})


# -- checkpoints ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """A 4-step run of the example script, with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("true_lines") / "run"
    reset_accelerate_state()
    example = load_example("dcgan_mnist")
    assert example.main([*TINY, "--steps", "4", "--checkpoint-every", "2", "--keep-checkpoints", "3",
                         "--output-dir", str(out), "--data-dir", str(out.parent / "nodata")]) == 0
    reset_accelerate_state()
    return out


def resume_line(run: Path, capsys, resume: str = "latest", steps: int = 6) -> tuple[int, str]:
    flags = [*TINY, "--steps", str(steps), "--output-dir", str(run), "--data-dir", str(run.parent / "nodata"),
             "--resume", resume]
    return run_main(load_example("dcgan_mnist"), flags, capsys)


def damaged_copy(example_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(example_run, run)
    return run


def test_a_truncated_rng_file_is_called_truncated_not_a_full_disk(example_run, tmp_path, capsys):
    run = damaged_copy(example_run, tmp_path)
    rng = run / "checkpoints" / CK4 / "random_states_0.pkl"
    rng.write_bytes(rng.read_bytes()[: rng.stat().st_size // 2])
    code, line = resume_line(run, capsys)
    assert code == 2 and f"cannot read {rng} (truncated or corrupt?" in line
    assert f"resume from another checkpoint of the run (complete ones: {CK2})" in line
    assert "free space" not in line and "EINVAL" not in line.split("(truncated")[0]


def test_a_deleted_engine_state_is_a_damaged_checkpoint_not_fewer_processes(example_run, tmp_path, capsys):
    run = damaged_copy(example_run, tmp_path)
    (run / "checkpoints" / CK4 / "gan_accel_state_0.safetensors").unlink()
    code, line = resume_line(run, capsys)
    assert code == 2 and f"{CK4} is damaged: its engine state for process 0 (gan_accel_state_0.safetensors) is " \
        "missing" in line
    assert "fewer processes" not in line and f"complete ones: {CK2}" in line


def test_an_older_checkpoint_of_the_folder_is_refused_naming_the_fork(example_run, capsys):
    older = example_run / "checkpoints" / CK2
    code, line = resume_line(example_run, capsys, resume=str(older))
    assert code == 2 and f"{older} is an older checkpoint of the run in {example_run}, which has gone on to {CK4}" in line
    assert f"`--resume {older} --output-dir NEW`" in line and "`--resume latest`" in line


def test_resume_of_the_checkpoints_folder_names_its_checkpoints(example_run, capsys):
    code, line = resume_line(example_run, capsys, resume=str(example_run / "checkpoints"))
    assert code == 2 and "is the folder of a run's checkpoints, not one checkpoint: pass one of them" in line
    assert f"({CK2}, {CK4})" in line and "--resume latest" in line


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_last_checkpoint_stays(tmp_path, monkeypatch):
    """torch's zip writer on a full disk says only "[enforce fail at inline_container.cc:672] . unexpected pos":
    the line says no space is left (the free space, read where the checkpoint is written)."""
    import gan_accel.storage.files as files

    t = trainer(tmp_path, DataLoader(TensorDataset(make_images(16)), batch_size=4), checkpoint_every=2, max_steps=4)
    save = torch.save

    def full_after_step_2(obj, f, *args, **kwargs):  # the real writer, on a device that is always full
        if "checkpoint_00000004" in str(f):
            f = "/dev/full"
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_after_step_2)
    monkeypatch.setattr(files, "free_space", lambda path: 0 if path is not None else None)
    with pytest.raises(RunFolderError) as raised:
        t.fit()
    message = str(raised.value)
    assert "cannot write checkpoint" in message and "No space left on device (ENOSPC): 0 bytes free" in message
    assert "torch's file writer stopped part-way (unexpected pos" in message and "enforce fail" not in message
    assert f"The last complete checkpoint is {tmp_path / 'run' / 'checkpoints' / CK2}" in message


# -- the command line -------------------------------------------------------------------------------------------
# (``gan-accel info RUN`` into a pipe whose reader has gone: tests/test_cli.py::test_the_command_runs_as_a_module)


def test_eval_without_mnist_says_where_it_looked_and_how_to_point_at_it(example_run, tmp_path, capsys, monkeypatch):
    from gan_accel.cli import evaluate, main

    monkeypatch.setattr(evaluate, "offline_digits", lambda info: None)  # a run that trained on MNIST
    capsys.readouterr()
    code = main(["eval", str(example_run), "--data-dir", str(tmp_path / "nodata"), "--num", "10"])
    line = one_error_line(capsys.readouterr().err)
    raw = tmp_path / "nodata" / "MNIST" / "raw"
    assert code == 2 and f"MNIST is not in {raw} (looked for train-images-idx3-ubyte" in line
    assert "--data-dir DIR" in line and "GAN_ACCEL_DATA_DIR" in line and "--download" in line
    assert "download=True" not in line


def test_a_huge_width_is_refused_before_the_model_is_built(tmp_path, capsys):
    code, line = run_main(load_example("dcgan_mnist"), ["--width", "100000", "--output-dir", str(tmp_path / "r")],
                          capsys)
    assert code == 2 and "--width: '100000' is more than 1,024, the largest allowed" in line
