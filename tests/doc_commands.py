"""The shell commands of the README and of the docs pages, read and scaled for tests/test_docs_shell.py.

Reading each page's ```bash blocks into commands (``a && b`` is two, ``# exits 2`` the expected code),
a script's flags read from its own argparse parser, the scaling of step counts and checkpoint paths
(tests/test_docs_shell.py's module docstring states the rules; its ``rewrite()`` applies them), and running a
command in this process (``gan_accel.cli.main`` or ``runpy``) with its exit code and output.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import runpy
import shlex
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from doc_pages import README, ROOT, page_name, pages

SCALE = 1000  # the README's runs are this many times longer than the test's
SCALED_FLAGS = ("--steps", "--checkpoint-every", "--sample-every", "--log-every", "--eval-every")
SMALL_VALUES = {"--batch-size": "8", "--width": "8", "--eval-samples": "100", "--num-eval": "200"}
SMALL_SWITCHES = ("--no-progress",)
LENGTH_FLAGS_DROPPED = ("--epochs", "--images", "--kimg")  # replaced by the scaled default --steps
TEACH = ("teach tests/test_docs_shell.py: add a case to rewrite() that runs this kind of command at small "
         "settings (or checks it without running it, saying why), and describe the rule in the module docstring")


# -- reading the pages -------------------------------------------------------------------------------
@dataclass
class Command:
    page: str  # README.md, docs/cli.md, ...
    block: int  # 1-based number of the ```bash block on its page
    line: str  # the page's line (continuations joined), for messages
    env: dict[str, str]
    argv: list[str]
    expect: int = 0  # exit code the line's comment names, else 0


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) at the first ``#`` outside quotes that starts a word."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
    return line, ""


def shell_commands(page: Path = README, text: str | None = None) -> list[Command]:
    """Every command of every ```bash block of ``page`` (or of ``text``), in order; ``a && b`` gives two commands."""
    name = page_name(page)
    text = page.read_text() if text is None else text
    commands = []
    for number, block in enumerate(re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL), start=1):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            code, comment = _split_comment(line)
            if not code.strip():
                continue
            lexer = shlex.shlex(code, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
            expect = re.search(r"\bexits?(?: with)?(?: code| status)? (\d+)", comment)
            parts: list[list[str]] = [[]]
            for token in tokens:
                if token == "&&":
                    parts.append([])
                elif token and set(token) <= set("();<>|&"):
                    pytest.fail(f"{name} bash block {number}: {line.strip()!r} uses {token!r}, which the shell test "
                                f"does not run; write one command per line (or '&&'), or {TEACH}")
                else:
                    parts[-1].append(token)
            for part in parts:
                env = {}
                while part and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", part[0]):
                    key, value = part.pop(0).split("=", 1)
                    env[key] = value
                if part:
                    commands.append(Command(name, number, line.strip(), env, part,
                                            int(expect.group(1)) if expect and part is parts[-1] else 0))
    return commands


def docs_shell_commands() -> dict[str, list[Command]]:
    """Each page's commands, pages in reading order (pages without a ```bash block left out)."""
    every = {page_name(page): shell_commands(page) for page in pages()}
    return {name: commands for name, commands in every.items() if commands}


# -- a script's own flags ---------------------------------------------------------------------------
class _Captured(Exception):
    pass


_PARSERS: dict[Path, argparse.ArgumentParser] = {}


def script_parser(script: Path) -> argparse.ArgumentParser:
    """The script's argparse parser, caught at its first ``parse_args`` (nothing after it runs)."""
    script = script.resolve()
    if script not in _PARSERS:
        original = argparse.ArgumentParser.parse_args

        def capture(self, args=None, namespace=None):
            _PARSERS[script] = self
            raise _Captured

        argparse.ArgumentParser.parse_args = capture
        saved_argv, saved_path, saved_modules = sys.argv, list(sys.path), set(sys.modules)
        try:
            sys.argv = [str(script)]
            with contextlib.redirect_stdout(io.StringIO()):
                runpy.run_path(str(script), run_name="__main__")
        except _Captured:
            pass
        finally:
            argparse.ArgumentParser.parse_args = original
            sys.argv, sys.path[:] = saved_argv, saved_path
            for name in set(sys.modules) - saved_modules:  # the script's siblings (dcgan_mnist, worker, ...)
                if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(script.parent)):
                    del sys.modules[name]
        if script not in _PARSERS:
            pytest.fail(f"{script.relative_to(ROOT)} parsed no arguments: the shell test reads each script's flags "
                        f"from its argparse parser")
    return _PARSERS[script]


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _default_number(action: argparse.Action) -> float | None:
    """The flag's default: argparse's, or the number its help names (``(default 5000)``) when that is None."""
    if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
        return action.default
    found = re.search(r"default:? ([0-9][0-9_,.]*)", action.help or "")
    return float(found.group(1).replace(",", "").replace("_", "")) if found else None


def check_script_flags(script: Path, args: list[str], line: str) -> None:
    """The script's own parser accepts these flags (a usage error exits 2 with its message)."""
    parser = script_parser(script)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exit_:
        if exit_.code:
            pytest.fail(f"{line!r}: {script.name} refuses its flags {args}: {stderr.getvalue().strip()}")


# -- scaling a command's flags ---------------------------------------------------------------------------
def scale_steps(value: float) -> int:
    return max(1, math.ceil(value / SCALE))


def scale_checkpoint_paths(args: list[str]) -> list[str]:
    return [re.sub(r"checkpoint_(\d{8})\b", lambda m: f"checkpoint_{scale_steps(int(m.group(1))):08d}", a)
            for a in args]


def small_script_args(script: Path, args: list[str], line: str, mnist: bool) -> list[str]:
    """A page's flags for ``script``, scaled down (see the module docstring), checked by its parser."""
    check_script_flags(script, args, line)
    small = small_args(script_parser(script), args, mnist)
    check_script_flags(script, small, line)
    return small


def train_parser() -> argparse.ArgumentParser:
    """The parser of ``gan-accel train``."""
    from gan_accel.cli import build_parser

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return commands.choices["train"]


def check_parses(parser: argparse.ArgumentParser, args: list[str], line: str, refusal: str) -> None:
    """``parser`` accepts ``args`` (the doc's ``line``); else the test fails naming ``refusal`` and argparse's words."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exit_:
        if exit_.code:
            pytest.fail(f"{line!r}: {refusal} {args}: {stderr.getvalue().strip()}")


def check_train_flags(args: list[str], line: str) -> None:
    """``gan-accel train``'s own parser accepts these flags."""
    check_parses(train_parser(), args, line, "gan-accel train refuses its flags")


def small_train_args(args: list[str], line: str) -> list[str]:
    """``gan-accel train``'s flags (after ``train``), scaled down like an example's, checked by its parser."""
    check_train_flags(args, line)
    small = small_args(train_parser(), args, mnist=True)
    check_train_flags(small, line)
    return small


def canonical(options: dict[str, argparse.Action], flag: str) -> str:
    """``flag`` as the parser's own flag: ``_`` read as ``-``, and another tool's name for it (docs/cli.md's
    table of aliases: ``--max_train_steps`` is ``--steps``) as gan_accel's."""
    name = flag if flag in options else flag[:2] + flag[2:].replace("_", "-")
    action = options.get(name)
    return action.option_strings[0] if action is not None and name not in action.option_strings[1:] else name


def small_args(parser: argparse.ArgumentParser, args: list[str], mnist: bool) -> list[str]:
    """The scaling of the module docstring, for any parser with the examples' flags."""
    own = _options(parser)
    options = parser.options() if hasattr(parser, "options") else own  # gan_accel's parsers: the aliases too
    args = scale_checkpoint_paths(args)
    given: dict[str, str] = {}
    kept: list[str] = []
    i = 0
    while i < len(args):
        flag = canonical(options, args[i]) if args[i].startswith("--") else args[i]
        takes_value = flag in options and options[flag].nargs not in (0, "?")
        if takes_value and i + 1 < len(args):
            given[flag] = args[i + 1]
            if flag not in LENGTH_FLAGS_DROPPED and flag not in SCALED_FLAGS and flag not in SMALL_VALUES:
                kept += [args[i], args[i + 1]]
            i += 2
        else:
            kept.append(args[i])
            i += 1
    options = own
    extra: list[str] = []
    for flag in SCALED_FLAGS:
        if flag in options:
            value = float(given[flag]) if flag in given else _default_number(options[flag])
            if value is not None:
                extra += [flag, str(scale_steps(value))]
    for flag, value in SMALL_VALUES.items():
        if flag in options:
            extra += [flag, value]
    extra += [flag for flag in SMALL_SWITCHES if flag in options and flag not in kept]
    if "--dataset" in options and not mnist:  # never a download attempt: the offline digit set
        if "--dataset" in kept:
            index = kept.index("--dataset")
            del kept[index:index + 2]
        extra += ["--dataset", "digits"]
    return kept + extra


def run_in_process(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``gan-accel ARGS`` through ``gan_accel.cli.main``, or ``python SCRIPT ARGS`` through ``runpy``, in this
    process with ``env`` added to its environment (and the launcher's variables removed), with its exit code
    and output."""
    from conftest import reset_accelerate_state

    out, err = io.StringIO(), io.StringIO()
    env = env or {}
    saved_env = {name: os.environ.get(name) for name in (*LAUNCHER_VARIABLES, *env)}
    saved_argv, saved_path, saved_modules = sys.argv, list(sys.path), set(sys.modules)
    script = None if argv[0] == "gan-accel" else Path(argv[1]).resolve()
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(env)
    reset_accelerate_state()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if script is None:
                    from gan_accel.cli import main

                    code = main(argv[1:])
                else:
                    sys.argv = argv[1:]
                    sys.path.insert(0, str(script.parent))  # as python does: the script's siblings import
                    runpy.run_path(str(script), run_name="__main__")
                    code = 0
            except SystemExit as exit_:  # argparse, or the script's sys.exit(main())
                code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
            except Exception:  # what python would print before exiting with 1
                traceback.print_exc()
                code = 1
    finally:
        reset_accelerate_state()
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name in set(sys.modules) - saved_modules:  # the script's siblings (dcgan_mnist for conditional_mnist)
            where = str(getattr(sys.modules[name], "__file__", "") or "")
            if script is not None and where.startswith(str(script.parent)):
                del sys.modules[name]
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GAN_ACCEL_DATA_DIR")


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _mnist() -> str | None:
    from conftest import mnist_dir

    return mnist_dir()
