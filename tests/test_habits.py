"""The flags users type by habit: ``_`` for ``-`` in every long option, diffusers' and NVlabs' names for
gan_accel's flags, ``gan-accel sample --seeds/--trunc``, ``--resume auto`` in a requeue loop, and the line that
names ``accelerate launch`` when GPUs sit idle.

Checked against independent behaviour: an alias's namespace against the one gan_accel's own spelling gives, a
seed's image against ``--num 1 --seed s``, a truncated sample against G run on the scaled latent by hand, a
requeued run's final weights against an uninterrupted run's, the aliases docs/cli.md lists against the table.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import reset_accelerate_state
from gan_accel.cli import build_parser
from gan_accel.cli.aliases import SAME_NAME, SAMPLING, TRAINING
from gan_accel.settle import steps_for
from test_train_cli import TINY, error_line, gan_accel, write_images
from test_user_errors import load_example

ROOT = Path(__file__).resolve().parents[1]


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def parses(argv: list[str]) -> bool:
    try:
        parse(argv)
    except SystemExit:
        return False
    return True


def usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# -- _ for - ------------------------------------------------------------------------------------------------
def test_every_long_option_of_every_command_takes_underscores(capsys):
    """Each option with a ``-`` inside, written with ``_`` (as ``--x_y v`` and ``--x_y=v``), parses like itself."""
    required = {"train": ["--data", "d"], "sample": ["run", "--out", "o.png"], "eval": ["run"], "info": ["run"],
                "plot": ["run"], "export": ["run", "dir"]}
    checked = 0
    for name, parser in commands().items():
        assert not any("_" in flag for a in parser._actions for flag in a.option_strings), "a flag spelled with _"
        for action in parser._actions:
            for flag in (f for f in action.option_strings if f.startswith("--") and "-" in f[2:]):
                if action.nargs == 0:
                    forms = [[flag.replace("-", "_").replace("__", "--", 1)]]
                    own = [flag]
                else:
                    value = next(v for v in ([str(action.choices[0])] if action.choices else ["1", "0.5", "x.png"])
                                 if parses([name, *required[name], flag, v]))
                    under = flag[:2] + flag[2:].replace("-", "_")
                    forms, own = [[under, value], [f"{under}={value}"]], [flag, value]
                if flag in ("--help",) or set(required[name]) & set(own):
                    continue
                expected = vars(parse([name, *required[name], *own]))
                for form in forms:
                    assert vars(parse([name, *required[name], *form])) == expected, (name, form)
                checked += 1
    assert checked >= 50, checked


def test_a_value_after_a_bare_double_dash_is_left_alone():
    from gan_accel.cli.aliases import normalise

    assert normalise(["--output_dir", "a_b", "--", "--not_an_option"], lambda n: False) == \
        ["--output-dir", "a_b", "--", "--not_an_option"]
    assert normalise(["--own_flag"], lambda n: n == "--own_flag") == ["--own_flag"]


# -- diffusers' and NVlabs' names ---------------------------------------------------------------------------
DIFFUSERS = ["--output_dir", "o", "--train_batch_size", "16", "--gradient_accumulation_steps", "2",
             "--max_train_steps", "30", "--checkpointing_steps", "7", "--checkpoints_total_limit", "3",
             "--report_to", "tensorboard", "--mixed_precision", "bf16", "--dataloader_num_workers", "2",
             "--resume_from_checkpoint", "runs/x/checkpoints/checkpoint_00000004"]
OURS = ["--output-dir", "o", "--batch-size", "16", "--grad-accum", "2", "--steps", "30", "--checkpoint-every", "7",
        "--keep-checkpoints", "3", "--log-with", "tensorboard", "--mixed-precision", "bf16", "--num-workers", "2",
        "--resume", "runs/x/checkpoints/checkpoint_00000004"]


def test_a_diffusers_command_parses_as_gan_accels_own_spelling():
    assert vars(parse(["train", "--data", "d", *DIFFUSERS])) == vars(parse(["train", "--data", "d", *OURS]))
    # diffusers starts a new run when 'latest' finds no checkpoint: that is --resume auto
    assert parse(["train", "--data", "d", "--resume_from_checkpoint", "latest"]).resume == "auto"
    assert parse(["train", "--data", "d", "--report_to", "none"]).log_with == []
    assert parse(["train", "--data", "d", "--report_to=wandb,tensorboard"]).log_with == ["wandb", "tensorboard"]


def test_nvlabs_flags_parse_as_gan_accels_own_spelling():
    nvlabs = parse(["train", "--data", "d", "--outdir", "o", "--kimg", "1.5", "--mirror=1", "--snap", "5",
                    "--workers", "3"])
    ours = parse(["train", "--data", "d", "--output-dir", "o", "--images", "1500", "--random-flip",
                  "--checkpoint-every", "5", "--sample-every", "5", "--num-workers", "3"])
    assert vars(nvlabs) == vars(ours)
    for flags, flip in ((["--mirror"], True), (["--mirror", "1"], True), (["--mirror=true"], True),
                        (["--mirror=0"], False), (["--mirror", "false"], False), ([], False)):
        assert parse(["train", "--data", "d", *flags]).random_flip is flip, flags
    # --kimg is thousands of real images over all processes: steps of the batch from them
    args = parse(["train", "--data", "d", "--kimg", "1.5", "--batch-size", "8"])
    assert steps_for(vars(args), batches_per_epoch=10) == math.ceil(1500 / 8)
    assert steps_for(vars(args), batches_per_epoch=10, processes=2) == math.ceil(1500 / 16)
    assert parse(["sample", "run", "--outdir", "out", "--seeds", "1"]).out == "out"


def test_the_example_scripts_read_the_same_names():
    example = load_example("dcgan_mnist")
    def without(flags: list[str], flag: str) -> list[str]:  # the MNIST scripts have no data workers
        return flags[:flags.index(flag)] + flags[flags.index(flag) + 2:]

    flags, ours = without(DIFFUSERS, "--dataloader_num_workers"), without(OURS, "--num-workers")
    assert vars(example.parse_args(flags)) == vars(example.parse_args(ours))
    assert example.parse_args(["--kimg", "2"]).images == 2000
    assert example.parse_args(["--snap", "9"]).checkpoint_every == 9
    for name in ("toy_2d", "custom_modules"):  # scripts with flags of their own: the aliases of those they have
        script = load_example(name)
        assert vars(script.parse_args(["--output_dir", "o", "--max_train_steps", "7", "--train_batch_size", "16",
                                       "--resume_from_checkpoint", "latest"])) == \
            vars(script.parse_args(["--output-dir", "o", "--steps", "7", "--batch-size", "16", "--resume", "auto"]))


def test_abbreviations_that_worked_before_the_aliases_still_do():
    """argparse reads a unique prefix of a flag; an alias never makes one ambiguous (it is read in full only)."""
    for short, dest, value in (("--check", "checkpoint_every", 5), ("--grad", "grad_accum", 2),
                               ("--out", "output_dir", "o"), ("--max-t", "max_time", 60.0),
                               ("--mi", "mixed_precision", "bf16")):
        assert getattr(parse(["train", "--data", "d", short, str(value)]), dest) == value, short


@pytest.mark.parametrize("flags, says", [
    (["--report_to", "neptune"], "argument --report-to: 'neptune' is not a tracker gan_accel logs to: name one of"),
    (["--mirror=maybe"], "argument --mirror: 'maybe' is not on or off: write 1 or 0"),
    (["--kimg", "0"], "argument --kimg: '0' is not a number > 0"),
    (["--kimg", "1", "--max_train_steps", "5"], "not allowed with argument --kimg"),
    (["--snap", "-1"], "argument --snap: '-1' is not a whole number >= 1"),
    (["--train_batch_size", "0"], "argument --batch-size: '0' is not a whole number >= 1"),
])
def test_a_value_that_cannot_be_mapped_is_one_line(flags, says, capsys):
    assert says in usage_error(["train", "--data", "d", *flags], capsys)


def test_help_shows_no_alias_and_the_docs_table_lists_every_one():
    parsers = commands()
    aliases = {alias.name for alias in (*TRAINING, *SAMPLING)}
    for name in ("train", "sample"):
        text = parsers[name].format_help()
        shown = set(re.findall(r"--[a-z0-9-]+", text))
        assert not shown & aliases, shown & aliases
    # the hidden --kimg sits in the length group without breaking how the usage line draws it
    assert "[--steps STEPS | --epochs EPOCHS | --images IMAGES]" in " ".join(parsers["train"].format_usage().split())
    table = (ROOT / "docs" / "cli.md").read_text()
    for command, aliases in (("train", TRAINING), ("sample", SAMPLING)):
        for alias in aliases:
            row = (f"| `{alias.name[:2] + alias.name[2:].replace('-', '_')}` | {alias.tool} | {command} | "
                   f"{', '.join(f'`{flag}`' for flag in alias.targets)} | {alias.meaning} |")
            assert row in table, f"docs/cli.md's table of aliases lacks (or words otherwise) {row}"
    for flag, tool in SAME_NAME.items():
        assert re.search(rf"^\| `{flag}` \| {tool} \|", table, flags=re.M), f"docs/cli.md's table lacks {flag}"


# -- gan-accel sample --seeds, --trunc ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """2 steps of a width-4 dcgan on 16 RGB images."""
    root = tmp_path_factory.mktemp("habits")
    write_images(root / "photos", 16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GAN_ACCEL_CACHE", str(root / "cache"))
        reset_accelerate_state()
        from gan_accel.cli import main

        assert main(["train", "--data", str(root / "photos"), "--output-dir", str(root / "run"), "--steps", "2",
                     *TINY]) == 0
        reset_accelerate_state()
    return root / "run"


def test_seeds_write_one_image_per_seed_each_the_image_of_num_1_and_that_seed(small_run, tmp_path, capsys):
    code, out, err = gan_accel(["sample", small_run, "--seeds", "0-2,7,1", "--out", tmp_path / "seeds"], capsys)
    assert code == 0, err[-3000:]
    names = sorted(p.name for p in (tmp_path / "seeds").iterdir())
    assert names == ["seed0000.png", "seed0001.png", "seed0002.png", "seed0007.png"], "one per seed, 1 once"
    assert "4 samples" in out and "seeds 0-2,7" in out
    for seed in (0, 2, 7):
        single = tmp_path / f"single{seed}"
        assert gan_accel(["sample", small_run, "--num", "1", "--seed", seed, "--format", "folder", "--out", single],
                         capsys)[0] == 0
        assert (tmp_path / "seeds" / f"seed{seed:04d}.png").read_bytes() == (single / "000000.png").read_bytes()
    # the same seeds as a grid and as arrays, in the order listed
    assert gan_accel(["sample", small_run, "--seeds", "7,0", "--out", tmp_path / "s.npz"], capsys)[0] == 0
    both = np.load(tmp_path / "s.npz")["images"]
    for index, seed in enumerate((7, 0)):
        assert gan_accel(["sample", small_run, "--num", "1", "--seed", seed, "--out", tmp_path / f"n{seed}.npz"],
                         capsys)[0] == 0
        np.testing.assert_array_equal(both[index], np.load(tmp_path / f"n{seed}.npz")["images"][0])


def test_truncation_scales_the_latent_towards_zero_and_psi_1_changes_nothing(small_run, tmp_path, capsys):
    from gan_accel import load_generator

    for psi in ("0.5", "1"):
        assert gan_accel(["sample", small_run, "--num", "5", "--seed", "3", "--trunc", psi,
                          "--out", tmp_path / f"t{psi}.npz"], capsys)[0] == 0
    plain = ["sample", small_run, "--num", "5", "--seed", "3", "--out", tmp_path / "plain.npz"]
    assert gan_accel(plain, capsys)[0] == 0
    assert (tmp_path / "t1.npz").read_bytes() == (tmp_path / "plain.npz").read_bytes()
    G = load_generator(small_run)
    z = torch.randn(5, G.z_dim, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        by_hand = G(0.5 * z).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "t0.5.npz")["images"], by_hand, rtol=0, atol=1e-6)
    assert not np.allclose(np.load(tmp_path / "t0.5.npz")["images"], np.load(tmp_path / "plain.npz")["images"])
    # psi 0: every latent is the mean latent, so every image is the one image of z = 0
    code, out, err = gan_accel(["sample", small_run, "--seeds", "0-3", "--trunc", "0", "--out", tmp_path / "z.npz"],
                               capsys)
    assert code == 0 and "truncation psi 0" in out, err
    images = np.load(tmp_path / "z.npz")["images"]
    with torch.no_grad():
        np.testing.assert_allclose(images, G(torch.zeros(4, G.z_dim)).numpy(), rtol=0, atol=1e-6)
    # a walk is truncated too
    assert gan_accel(["sample", small_run, "--interpolate", "--walks", "2", "--steps", "3", "--trunc", "0",
                      "--out", tmp_path / "walk.png"], capsys)[0] == 0
    assert len(set(np.asarray(Image.open(tmp_path / "walk.png")).reshape(-1).tolist())) > 1


@pytest.mark.parametrize("flags, says", [
    (["--seeds", "5-3"], "'5-3' counts down: write the smaller seed first (3-5)"),
    (["--seeds", "0-x"], "is not a list of seeds: write 0-35,40"),
    (["--seeds", "0-20000000"], "lists more than 10,000,000 seeds"),
    (["--seeds", "1", "--num", "4"], "--seeds gives one image per seed listed: leave out --num"),
    (["--seeds", "1", "--seed", "4"], "leave out --seed"),
    (["--trunc", "nan"], "argument --trunc: 'nan' is not a finite number"),
])
def test_seed_and_truncation_mistakes_are_one_line(small_run, flags, says, tmp_path, capsys):
    assert says in error_line(["sample", small_run, *flags, "--out", tmp_path / "never"], capsys)
    assert not (tmp_path / "never").exists()


def test_a_conditional_g_samples_seeds_in_the_class_named():
    from gan_accel.errors import ConfigError
    from gan_accel.models import build_models, default_spec
    from gan_accel.sampling import sample_images

    torch.manual_seed(0)
    G, _ = build_models(default_spec("dcgan", 28, 1, 3, width=4))
    G.eval()
    with pytest.raises(ConfigError, match="pass a label"):
        sample_images(G, seeds=[1, 2])
    images, labels = sample_images(G, seeds=[4, 1], label=2, truncation=0.7)
    z = torch.randn(1, G.z_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(images[1:], G(0.7 * z, torch.tensor([2])), rtol=0, atol=1e-6)
    assert labels.tolist() == [2, 2]


# -- --resume auto ----------------------------------------------------------------------------------------------
def generator_weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "generator" / "model.safetensors")


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"


def test_a_requeue_loop_with_resume_auto_ends_as_the_uninterrupted_run(tmp_path, capsys):
    """The same command run again and again, each time stopped by its time limit after one step (a checkpoint is
    written at the stop), as a cluster would requeue it: a new run the first time, then one step further each
    time from the newest checkpoint, ending bitwise where a run that never stopped ends."""
    write_images(tmp_path / "photos", 16)
    straight = ["train", "--data", tmp_path / "photos", "--steps", "4", *TINY]
    assert gan_accel([*straight, "--output-dir", tmp_path / "straight"], capsys)[0] == 0
    command = [*straight, "--output-dir", tmp_path / "run", "--resume", "auto", "--max-time", "0.000001"]
    said = []
    for attempt in range(1, 5):
        code, out, err = gan_accel(command, capsys)
        assert code == 0, err[-3000:]
        said.append(next(line for line in out.splitlines() if "resume" in line.lower()))
        assert f"stopped at the time limit" in out and f"at step {attempt} of 4" in out, out
    assert "--resume auto: no checkpoint in" in said[0] and "a new run starts there" in said[0]
    for attempt, line in enumerate(said[1:], start=1):
        assert f"resumed from {tmp_path / 'run' / 'checkpoints' / f'checkpoint_{attempt:08d}'} at step {attempt}" \
            in line, line
    assert_same_weights(generator_weights(tmp_path / "run"), generator_weights(tmp_path / "straight"))
    events = [line.split('"event": "')[1].split('"')[0] for line in (tmp_path / "run" / "history.jsonl").read_text()
              .splitlines()]
    assert events == ["start", "resume", "resume", "resume"]


def test_auto_refuses_a_folder_it_cannot_continue_or_start_in(tmp_path, capsys):
    from gan_accel.engine.run_open import resolve_auto

    assert resolve_auto(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".lock").write_text("{}")  # a run stopped before writing anything
    assert resolve_auto(tmp_path / "empty") is None
    write_images(tmp_path / "photos", 16)
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "history.jsonl").write_text('{"event": "start"}\n')  # ended by an error line before its
    (tmp_path / "started" / "config.json").write_text("{}")  # first checkpoint: its lock was let go, it was not killed
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    for folder, says in (("started", "holds a run that wrote no complete checkpoint"),
                         ("other", "is not empty and holds no gan_accel checkpoint")):
        line = error_line(["train", "--data", tmp_path / "photos", "--output-dir", tmp_path / folder,
                           "--resume", "auto", *TINY], capsys)
        assert says in line and "move it away or choose another --output-dir" in line, line
    assert sorted(p.name for p in (tmp_path / "started").iterdir()) == ["config.json", "history.jsonl"], \
        "nothing written"


@pytest.mark.slow  # a training process of its own, killed with SIGKILL
def test_a_run_killed_between_checkpoints_goes_on_with_the_same_command(tmp_path, capsys):
    """SIGKILL at step 6 (checkpoints every 4), then the same ``--resume auto`` command: it goes on from step 4
    and ends with the weights of the run that was never killed."""
    import signal
    from test_crash import FLAGS, example_main

    out = tmp_path / "killed" / "run"
    killed = start_auto(out)
    _, stderr = killed.communicate(timeout=600)
    assert killed.returncode == -signal.SIGKILL, stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint_00000004"]
    code, stdout, stderr = example_main(out, capsys, "--resume", "auto")
    assert code == 0, stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'checkpoint_00000004'} at step 4" in stdout
    straight = tmp_path / "straight" / "run"
    assert example_main(straight, capsys)[0] == 0
    assert_same_weights(generator_weights(out), generator_weights(straight))
    assert FLAGS[FLAGS.index("--steps") + 1] == "12"


def start_auto(out: Path):
    """tests/crash_driver.py: the example with ``--resume auto`` from the first start, SIGKILLed after step 6."""
    import os
    import subprocess
    import sys

    from test_crash import DRIVER, FLAGS

    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    args = [sys.executable, DRIVER, "kill-train", "6", "--", "--data-dir", str(out.parent / "nodata"),
            "--output-dir", str(out), "--resume", "auto", *FLAGS]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


@pytest.mark.slow  # two launches of two gloo processes
def test_two_processes_agree_on_auto_when_started_and_when_requeued(tmp_path):
    """The main process decides under the lock and tells the other: a new run, then the same command again goes on
    from the checkpoint the time limit wrote, on both ranks."""
    import os
    import subprocess

    from conftest import free_port

    write_images(tmp_path / "photos", 40)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", GAN_ACCEL_CACHE=str(tmp_path / "cache"))

    def launch(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
             "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "gan_accel.cli", "train",
             "--data", str(tmp_path / "photos"), "--output-dir", str(tmp_path / "run"), "--steps", "3",
             "--resume", "auto", *map(str, TINY), *flags], capture_output=True, text=True, timeout=600, env=env,
            cwd=tmp_path)

    first = launch("--max-time", "0.000001")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "--resume auto: no checkpoint in" in first.stdout
    # the processes agree on the stop at a step end: the first, or the next one under two processes
    stop = int(re.search(r"stopped at the time limit \(.*?\) at step (\d) of 3", first.stdout)[1])
    second = launch()
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {tmp_path / 'run' / 'checkpoints' / f'checkpoint_{stop:08d}'} at step {stop}" \
        in second.stdout
    for rank in (0, 1):
        assert f"process {rank}/2: 3 steps" in second.stdout


# -- several GPUs, one process ------------------------------------------------------------------------------------
def test_several_visible_gpus_and_one_process_name_the_launch_in_one_line(tmp_path, capsys, monkeypatch):
    from gan_accel import TrainConfig, build_accelerator
    from gan_accel.engine.launch import idle_gpus_note

    for count, lines in ((4, 1), (1, 0), (0, 0)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        reset_accelerate_state()
        capsys.readouterr()
        accelerator = build_accelerator(TrainConfig(output_dir=str(tmp_path / "run"), max_steps=1))
        said = [line for line in capsys.readouterr().out.splitlines() if "GPUs are visible" in line]
        assert len(said) == lines and accelerator.num_processes == 1
        if lines:
            assert "4 GPUs are visible but 1 process trains" in said[0]
            assert "`accelerate launch --num_processes 4 " in said[0] and "trains on all 4" in said[0]
    reset_accelerate_state()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    command = idle_gpus_note(1, ["/venv/bin/gan-accel", "train", "--data", "photos"])
    assert "accelerate launch --num_processes 8 -m gan_accel.cli train ..." in command
    assert "accelerate launch --num_processes 8 examples/dcgan_mnist.py ..." in \
        idle_gpus_note(1, ["examples/dcgan_mnist.py", "--steps", "9"])
    assert idle_gpus_note(2, ["examples/dcgan_mnist.py"]) is None  # a launch that uses them is not told
