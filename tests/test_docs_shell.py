"""The shell commands of the README and of every docs page are real: every command of their ```bash blocks
runs, in order, at small settings (or, where it cannot run here, is checked).

Pages run in reading order (the README, then mkdocs.yml's nav). Each page's commands run one after the other,
in page order, in a scratch folder of the page's own (the working directory), as a reader following that page
would run them: a later command may use what an earlier one of the same page wrote (``--resume latest`` after a
training run, ``gan-accel sample runs/...`` after it), and a page never depends on another page's commands.
The repository's ``examples/`` and ``benchmarks/`` folders are symlinked into each scratch folder, and
``./data`` is a symlink to real MNIST ($GAN_ACCEL_MNIST_DIR, else ../shared/data) when it exists.
Every command must exit 0, or the code its comment names (``# exits 2``).

How each kind of command is run (the rules; ``rewrite()`` applies them):

* ``python examples/<script>.py ...`` runs at 1/1000 of its length, in this test's process: every step
  count (``--steps``, ``--checkpoint-every``, ``--sample-every``, ``--log-every``, ``--eval-every``, or
  their names from diffusers and NVlabs, docs/cli.md's aliases, and with ``_`` for ``-``;
  the value in the command or else the script's default, read from its own argument parser) is
  divided by 1000, rounded up, and so is the step in a ``checkpoint_<step>`` path (a page's
  ``checkpoint_00004000`` of a 5,000-step run is ``checkpoint_00000004`` of the 5-step run). An
  ``--epochs`` (or NVlabs' ``--kimg``) is dropped for the scaled default ``--steps``. Then, where the script
  has the flag: ``--batch-size 8``, ``--width 8``, ``--eval-samples 100``, ``--num-eval 200``, ``--no-progress``.
  Without real MNIST, ``--dataset digits`` (the offline set; never a download attempt). ``--eval``
  is kept and scores ``--num-eval 200`` samples (on a new machine the first run also trains the
  MNIST classifier once, about 30 s, cached under $GAN_ACCEL_CACHE). The script runs as ``python`` would
  run it (``runpy`` as ``__main__``, that argv, its folder first on ``sys.path``, the command's environment,
  the exit code from ``SystemExit``), in this process: a process of its own would spend most of its time
  importing torch. tests/test_example.py runs both MNIST scripts as processes of their own, and the
  ``accelerate launch`` commands below are processes too.
* ``accelerate launch [launch flags] <script> [flags]``: the script's flags as above; on a machine
  without CUDA with ``ACCELERATE_USE_CPU=1`` (a GPU launch becomes the same number of gloo CPU
  processes, at most 2), and on a free ``--main_process_port``. A multi-machine launch
  (``--num_machines`` > 1) cannot run on one machine: it is parsed by accelerate's own launch parser
  and by the script's parser, not run (tests/test_example.py runs its equivalent, two single-process
  machines on 127.0.0.1).
* ``gan-accel sample|info|plot|export ...`` (or ``python -m gan_accel.cli ...``) runs as written, with a
  checkpoint path scaled as above; ``gan-accel eval`` scores ``--num`` 200 samples at most. ``gan-accel
  train`` runs at 1/1000 of its length like an example script (its step flags scaled, from its own
  parser; ``--epochs`` and ``--images`` dropped; ``--batch-size 8``, ``--width 8``, ``--eval-samples 100``,
  ``--no-progress``). ``gan-accel export ... --push-to-hub`` is parsed, not run: the Hub cannot be
  reached here (tests/test_export.py pushes to a local stand-in). They run in this test's process,
  through ``gan_accel.cli.main`` (what the installed command calls; the pip rule checks that the command
  exists): each would otherwise spend most of its time importing torch. ``accelerate launch -m
  gan_accel.cli train ...`` runs as the launch rule above says, with the train command's small flags.
* ``python benchmarks/make_rgb_digits.py`` (the image set the guide trains on) runs in this process with
  ``--num`` at most 200, the rest as written: a data maker, seconds at that size.
* Checked, not run: ``pip install`` (the project is installed from this checkout, the ``gan-accel``
  command exists and every ``[extra]`` named is in pyproject.toml); ``python -m pytest`` (this test
  would run itself: without arguments it must be the command ``.ci/run`` runs; with arguments, they may
  only select tests: ``-x``, ``-q``, ``-v``, ``-k EXPR``, ``-m EXPR`` of markers pyproject.toml declares, and
  test files or folders that exist); ``accelerate config`` (interactive: the command and its parser must
  exist); ``python benchmarks/<script>.py [flags]`` other than the data maker above (the full suite takes half an
  hour: its flags must pass the script's own parser, and tests/test_benchmarks.py runs every section with
  ``--quick``);
  ``mkdocs build --strict`` (tests/test_docs.py runs it: the command, mkdocs.yml and the flags must exist)
  and ``mkdocs serve`` (it serves until stopped: the same check).

Anything else fails with a message saying how to teach ``rewrite()`` about it. The fast tests check
the rules and run the checks in seconds; the slow one runs everything.

Reading the pages' commands, the scripts' own flags, the scaling and the in-process runner live in
tests/doc_commands.py; ``rewrite()``, the checks and the tests are here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import free_port
import tomllib

from doc_commands import (TEACH, Command, _environment, _mnist, check_parses, check_script_flags,
                          check_train_flags, docs_shell_commands, run_in_process, scale_checkpoint_paths,
                          shell_commands, small_script_args, small_train_args)
from doc_pages import ROOT

EVAL_NUM_MAX = 200
GAN_ACCEL_AS_WRITTEN = ("sample", "info", "plot", "export")  # subcommands that only read a run and write small files
DATA_MAKER = "benchmarks/make_rgb_digits.py"  # run, not only parsed: the guide's image set
DATA_MAKER_NUM_MAX = 200
LINKED = ("examples", "benchmarks")  # repository folders the commands name by relative path


# -- the rules ----------------------------------------------------------------------------------------
@dataclass
class Step:
    """What the test does for one command of a page: run ``argv`` (with ``env``), or call ``check``."""

    command: Command
    argv: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[], None] | None = None
    why: str = ""
    in_process: bool = False  # gan-accel and python examples/...: in this process (run_in_process)


def _check_pip_install(args: list[str], line: str) -> None:
    extras_known = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    targets = [a for a in args if not a.startswith("-")]
    assert targets, f"{line!r}: pip install of nothing"
    for target in targets:
        match = re.fullmatch(r"(?P<base>[^\[\]]+)(?:\[(?P<extras>[^\]]*)\])?", target)
        assert match and match["base"] in (".", "gan_accel", "gan-accel"), (
            f"{line!r}: the shell test knows how to check installs of this project only; {TEACH}")
        for extra in filter(None, (match["extras"] or "").split(",")):
            assert extra.strip() in extras_known, f"{line!r}: pyproject.toml has no extra {extra!r}"
    import gan_accel

    importlib.metadata.distribution("gan_accel")
    assert Path(gan_accel.__file__).resolve().is_relative_to(ROOT), "gan_accel is not imported from this checkout"
    assert shutil.which("gan-accel"), "the gan-accel command is not installed (pip install -e . installs it)"


def _check_pytest(args: list[str], line: str) -> None:
    """Without arguments: the command .ci/run runs. With arguments: options that only select tests."""
    if not args:
        lines = (ROOT / ".ci" / "run").read_text().splitlines()
        ci = [shlex.split(text) for text in lines if text and not text.startswith("#")]
        assert ["python", "-m", "pytest"] in ci, (
            f"{line!r}: .ci/run must run exactly this command (the shell test does not run pytest itself)")
        return
    markers = {entry.split(":")[0].strip() for entry in
               tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-x", "-q", "-v"):
            i += 1
        elif arg in ("-k", "-m") and i + 1 < len(args):
            if arg == "-m":
                unknown = set(re.findall(r"\w+", args[i + 1])) - {"and", "or", "not"} - markers
                assert not unknown, f"{line!r}: pyproject.toml declares no marker {sorted(unknown)}"
            i += 2
        elif not arg.startswith("-"):
            assert (ROOT / arg.split("::")[0]).exists(), f"{line!r}: no test file or folder {arg}"
            i += 1
        else:
            pytest.fail(f"{line!r}: the shell test checks pytest options that select tests only, not {arg!r}; {TEACH}")


def _check_mkdocs(args: list[str], line: str) -> None:
    assert shutil.which("mkdocs"), "the mkdocs command is not installed (pip install -e \".[docs]\")"
    assert (ROOT / "mkdocs.yml").is_file(), "no mkdocs.yml at the repository root"
    assert args[0] in ("build", "serve") and set(args[1:]) <= {"--strict"}, f"{line!r}: no rule for it; {TEACH}"


def _check_accelerate_config() -> None:
    from accelerate.commands.config import get_config_parser

    assert shutil.which("accelerate"), "the accelerate command is not installed"
    get_config_parser()


def rewrite(command: Command, mnist: bool) -> Step:
    """The rules of the module docstring: how one command of a page runs here, or how it is checked."""
    argv, line = command.argv, f"{command.page}: {command.line}"
    env = dict(command.env)
    if argv[0] == "python" and argv[1:3] == ["-m", "gan_accel.cli"]:
        argv = ["gan-accel", *argv[3:]]
    if argv[0] == "pip" or argv[:3] == ["python", "-m", "pip"]:
        args = argv[argv.index("install") + 1:] if "install" in argv else pytest.fail(f"{line!r}: {TEACH}")
        return Step(command, check=lambda: _check_pip_install(args, line), why="pip install: checked, not run")
    if argv[:3] == ["python", "-m", "pytest"]:
        return Step(command, check=lambda: _check_pytest(argv[3:], line), why="a test command: checked, not run")
    if argv[0] == "mkdocs" and len(argv) > 1:
        return Step(command, check=lambda: _check_mkdocs(argv[1:], line),
                    why="the docs site: checked (tests/test_docs.py builds it)")
    if argv == ["accelerate", "config"]:
        return Step(command, check=_check_accelerate_config, why="interactive: the command exists")
    if argv[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                launch = launch_command_parser().parse_args(argv[2:])
        except SystemExit:
            pytest.fail(f"{line!r}: accelerate launch refuses its flags: {stderr.getvalue().strip()}")
        script = Path(launch.training_script)
        split = len(argv) - len(launch.training_script_args) - 1
        assert argv[split] == launch.training_script, line
        launch_flags, script_args = argv[2:split], list(launch.training_script_args)
        if launch.module:
            return _launch_module(command, launch, launch_flags, script_args, env, line)
        if not (ROOT / script).is_file():
            pytest.fail(f"{line!r}: no script {script} in the repository")
        if (launch.num_machines or 1) > 1:
            def check() -> None:
                check_script_flags(ROOT / script, script_args, line)

            return Step(command, check=check, why="several machines: parsed only (tests/test_example.py runs "
                                                  "two single-process machines on 127.0.0.1)")
        if launch.num_processes and launch.num_processes > 2:
            index = launch_flags.index("--num_processes")
            launch_flags[index + 1] = "2"
        if "--main_process_port" not in launch_flags:
            launch_flags = ["--main_process_port", str(free_port()), *launch_flags]
        import torch

        if not torch.cuda.is_available():
            env.setdefault("ACCELERATE_USE_CPU", "1")
        small = small_script_args(ROOT / script, script_args, line, mnist)
        return Step(command, ["accelerate", "launch", *launch_flags, str(script), *small], env)
    if argv[0] == "python" and len(argv) > 1 and argv[1] == DATA_MAKER:
        return Step(command, [sys.executable, argv[1], *_capped_num(argv[2:])], env, in_process=True)
    if argv[0] == "python" and len(argv) > 1 and argv[1].startswith("benchmarks/") and argv[1].endswith(".py"):
        if not (ROOT / argv[1]).is_file():
            pytest.fail(f"{line!r}: no script {argv[1]} in the repository")
        return Step(command, check=lambda: check_script_flags(ROOT / argv[1], argv[2:], line),
                    why="a benchmark: its flags parsed (tests/test_benchmarks.py runs the suite with --quick)")
    if argv[0] == "python" and len(argv) > 1 and argv[1].startswith("examples/") and argv[1].endswith(".py"):
        if not (ROOT / argv[1]).is_file():
            pytest.fail(f"{line!r}: no script {argv[1]} in the repository")
        return Step(command, [sys.executable, argv[1], *small_script_args(ROOT / argv[1], argv[2:], line, mnist)], env,
                    in_process=True)
    if argv[0] == "gan-accel":
        args = scale_checkpoint_paths(argv[1:])
        sub = args[0] if args else ""
        if sub == "eval":
            if "--num" in args:
                index = args.index("--num")
                args[index + 1] = str(min(int(args[index + 1]), EVAL_NUM_MAX))
            else:
                args += ["--num", str(EVAL_NUM_MAX)]
        elif sub == "train":
            args = ["train", *small_train_args(args[1:], line)]
        elif sub == "export" and "--push-to-hub" in args:
            return Step(command, check=lambda: _check_push(args, line),
                        why="--push-to-hub: parsed (the Hub is not reachable; tests/test_export.py pushes to a stand-in)")
        elif sub not in GAN_ACCEL_AS_WRITTEN:
            pytest.fail(f"{line!r}: no rule for `gan-accel {sub}`; {TEACH}")
        return Step(command, ["gan-accel", *args], env, in_process=True)
    pytest.fail(f"{line!r}: no rule for commands starting with {argv[0]!r}; {TEACH}")


def _capped_num(args: list[str]) -> list[str]:
    """The data maker's flags with ``--num`` at most DATA_MAKER_NUM_MAX."""
    args = list(args)
    if "--num" in args:
        index = args.index("--num")
        args[index + 1] = str(min(int(args[index + 1]), DATA_MAKER_NUM_MAX))
    else:
        args += ["--num", str(DATA_MAKER_NUM_MAX)]
    return args


def _check_push(args: list[str], line: str) -> None:
    """``gan-accel export ... --push-to-hub REPO``: the command's parser accepts it."""
    from gan_accel.cli import build_parser

    check_parses(build_parser(), args, line, "gan-accel refuses")


def _launch_module(command: Command, launch: argparse.Namespace, launch_flags: list[str], args: list[str],
                   env: dict[str, str], line: str) -> Step:
    """``accelerate launch [flags] -m gan_accel.cli train ...``: the launch rule, with the train command's small flags."""
    if launch.training_script != "gan_accel.cli" or not args or args[0] != "train":
        pytest.fail(f"{line!r}: the shell test launches `-m gan_accel.cli train` only; {TEACH}")
    if (launch.num_machines or 1) > 1:
        return Step(command, check=lambda: check_train_flags(args[1:], line), why="several machines: parsed only")
    if launch.num_processes and launch.num_processes > 2:
        index = launch_flags.index("--num_processes")
        launch_flags[index + 1] = "2"
    if "--main_process_port" not in launch_flags:
        launch_flags = ["--main_process_port", str(free_port()), *launch_flags]
    import torch

    if not torch.cuda.is_available():
        env.setdefault("ACCELERATE_USE_CPU", "1")
    return Step(command, ["accelerate", "launch", *launch_flags, "gan_accel.cli", "train",
                          *small_train_args(args[1:], line)], env)


# -- the tests ----------------------------------------------------------------------------------------
def test_every_shell_command_of_every_page_has_a_rule():
    """Fast: every command maps to a rule, and the commands that are only checked pass their checks."""
    commands = docs_shell_commands()
    assert "README.md" in commands, "the README has no ```bash block"
    assert commands["README.md"][0].argv[:2] == ["pip", "install"], "the README starts with the set-up commands"
    mnist = _mnist() is not None
    for command in (command for page in commands.values() for command in page):
        step = rewrite(command, mnist)
        if step.check is not None:
            step.check()


def test_the_rules_scale_a_run_and_its_checkpoints():
    """The rewrite of a resume from a page's step 4,000 of a 5,000-step run: step 4 of 5."""
    (command,) = shell_commands(text=(
        "```bash\npython examples/dcgan_mnist.py --resume runs/x/checkpoints/checkpoint_00004000 --epochs 25"
        " --width 64  # a comment\n```"))
    argv = rewrite(command, mnist=False).argv
    assert argv[1:4] == ["examples/dcgan_mnist.py", "--resume", "runs/x/checkpoints/checkpoint_00000004"]
    line = " ".join(argv)
    assert "--epochs" not in argv and "--width 64" not in line and "--no-progress" in argv
    for flags in ("--steps 5", "--checkpoint-every 1", "--sample-every 1", "--width 8", "--dataset digits"):
        assert flags in line
    (failing,) = shell_commands(text="```bash\ngan-accel serve runs/x   # exits 2\n```")
    assert failing.expect == 2
    with pytest.raises(pytest.fail.Exception, match="teach tests/test_docs_shell.py"):
        rewrite(failing, mnist=False)


def test_the_rules_check_test_and_docs_commands_without_running_them():
    """pytest with selecting options only, mkdocs build/serve: checked; anything else is refused."""
    checked = shell_commands(text=(
        "```bash\npython -m pytest -m 'not slow' tests/test_docs_shell.py -x -q\nmkdocs build --strict\nmkdocs serve\n"
        "python benchmarks/engine_overhead.py --control\n```"))
    for command in checked:
        step = rewrite(command, mnist=False)
        assert step.argv is None and step.check is not None, command.line
        step.check()
    for bad in ("python -m pytest -m 'not quick'", "python -m pytest tests/test_nothing.py",
                "python -m pytest --lf", "mkdocs gh-deploy"):
        (command,) = shell_commands(text=f"```bash\n{bad}\n```")
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            rewrite(command, mnist=False).check()


def run_shell_commands(commands: list[Command], scratch: Path) -> list[str]:
    """Run (or check) ``commands`` in order in ``scratch``, which must be the working directory; the timings."""
    mnist = _mnist()
    for name in LINKED:
        (scratch / name).symlink_to(ROOT / name, target_is_directory=True)
    if mnist is not None:
        (scratch / "data").symlink_to(Path(mnist).resolve(), target_is_directory=True)
    timings = []
    for command in commands:
        step = rewrite(command, mnist is not None)
        began = time.perf_counter()
        if step.check is not None:
            step.check()
        else:
            result = run_in_process(step.argv, step.env) if step.in_process else subprocess.run(
                step.argv, check=False, capture_output=True, text=True, timeout=900, cwd=scratch,
                env=_environment(step.env))
            assert result.returncode == command.expect, (
                f"{command.page} bash block {command.block}: {command.line!r}\nran as: {shlex.join(step.argv)} "
                f"(env {step.env}{', in this process' if step.in_process else ''})\n"
                f"exit {result.returncode}, expected {command.expect}\n"
                f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
        timings.append(f"{time.perf_counter() - began:6.1f} s  {step.why or shlex.join(step.argv or [])}")
    return timings


@pytest.mark.slow  # training runs, 2-process launches, evaluations with the MNIST classifier
@pytest.mark.parametrize("page", list(docs_shell_commands()))
def test_shell_commands_of_each_page_run_in_order_at_small_settings(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GAN_ACCEL_DATA_DIR", raising=False)  # the commands' default ./data, as for a reader
    print("\n".join(run_shell_commands(docs_shell_commands()[page], tmp_path)))
