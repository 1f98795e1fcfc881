"""What every command-line entry point shares: one ``error:`` line for every expected failure.

The example scripts and the ``gan-accel`` command use :class:`ArgumentParser` (a bad flag is one
line, exit 2), the number types below (``--epochs 0`` is refused by the parser, not by a traceback
later) and :func:`run_script`, which turns gan_accel's errors and the file system's into one line
naming the problem and the fix, exit 2. A traceback appears only for a bug, or with ``--debug``.
Under ``accelerate launch`` every process stops with the same error (the engine agrees on errors
across processes) and only the first prints it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, Callable, NoReturn

from .collective import leave_process_group
from .errors import GanAccelError, TrainingInterrupted
from .state.files import write_failure_reason
from .watchdog import (claim_ending, describe_collective_failure, exit_on_late_signals, first_to_end, interrupted_line,
                       run_record)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one ``error:`` line (exit 2) and that has ``--debug``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true", help="show the full traceback of any error")

    def error(self, message: str) -> NoReturn:
        if _prints():
            print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _number(kind: type, minimum: float, inclusive: bool, words: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {words}") from None
        if value != value or value in (float("inf"), float("-inf")) or value < minimum or \
                (not inclusive and value == minimum):
            raise argparse.ArgumentTypeError(f"{text!r} is not {words}")
        return value

    parse.__name__ = words  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, True, "a whole number >= 1")
nonnegative_int = _number(int, 0, True, "a whole number >= 0")


def bounded_int(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """A whole number in [low, high]: a size the parser refuses before any memory is allocated for it."""
    check = _number(int, low, True, f"a whole number >= {low}")

    def parse(text: str) -> int:
        value = check(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {high:,}, the largest allowed" +
                                             (f" ({why})" if why else ""))
        return value

    parse.__name__ = f"a whole number from {low} to {high:,}"
    return parse


MAX_SEED = 2**31 - 1  # config.MAX_SEED (scripts sit below config in the layering; a test keeps them equal)
seed_int = bounded_int(0, MAX_SEED, "what numpy and torch both accept as a seed")
positive_float = _number(float, 0.0, False, "a number > 0")
nonnegative_float = _number(float, 0.0, True, "a number >= 0")


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    value = nonnegative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1)")
    return value


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as an escape (``\\x1b``, ``\\n``,
    ``\\u202e``): file contents and names printed to a terminal cannot move the cursor, recolour it,
    clear it, or forge a line of the output. Printable characters, non-ASCII letters included, stay."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def describe(error: BaseException) -> str | None:
    """The one line for an expected failure, or None for a bug (which keeps its traceback)."""
    if isinstance(error, GanAccelError):
        return str(error)
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{write_failure_reason(error)}; check the path, its permissions and the free space"
    return None


SIGPIPE_EXIT = 128 + 13  # what a shell reports for a command that SIGPIPE ended (cat, grep, git | head)


def run_script(body: Callable[[], int], debug: bool = False) -> int:
    """Run a script's body; an expected failure becomes one ``error:`` line and exit code 2.

    A graceful stop (``TrainingInterrupted``) prints its line, then every rank leaves the process group
    together, and exits 128 + the signal. An interruption that did not finish the graceful stop (a
    second signal) says the step reached and the last complete checkpoint, once per launch.

    A reader that stops reading the output (``gan-accel info RUN | head``) ends the command quietly with
    exit code 141, as it ends ``cat`` or ``grep`` (killed by SIGPIPE: the shell reports 128 + 13): no
    error line, since nothing went wrong, and not 0, so ``set -o pipefail`` still sees a cut output
    exactly as it would with those tools. (Python ignores SIGPIPE, so the write raises BrokenPipeError.)
    """
    run_record.reset()  # what this script does is what its interruption line reports
    try:
        code = body()
        sys.stdout.flush()  # a closed pipe shows here, not at exit (where Python would print a traceback)
        leave_process_group()  # a clean exit of every rank of a launch (see its docstring)
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            if debug:
                raise
            if _prints():
                print(f"error: {describe(sys.exc_info()[1])}", file=sys.stderr)
            return 2
        return SIGPIPE_EXIT
    except TrainingInterrupted as stop:
        claim_ending()  # the watchdog leaves the line to this one
        if _prints():
            print(f"gan_accel: {stop}", file=sys.stderr, flush=True)
        exit_on_late_signals(stop.exit_code)  # the stop is complete: a launcher's SIGTERM only ends the exit
        # Every rank stopped at the same step: they leave together (see leave_process_group), so none exits,
        # and has the launcher SIGTERM the others, while another is still finishing its stop.
        try:
            leave_process_group()
        except Exception:  # a process that ended at once on a late signal: the stop is complete all the same
            pass
        return stop.exit_code
    except KeyboardInterrupt as interrupt:
        if debug:
            raise
        name = str(interrupt) if str(interrupt) in signal.Signals.__members__ else "SIGINT"  # as named by the
        code = 128 + signal.Signals[name]  # stop handler (gan_accel.callbacks.signals) for a signal that insisted
        # Say what is true (the step reached, the last checkpoint), once per launch.
        if claim_ending() and first_to_end(code, otherwise=_prints()):
            how = "interrupted (Ctrl-C)" if name == "SIGINT" else f"interrupted ({name})"
            print(f"error: {interrupted_line(how)}", file=sys.stderr)
        return code
    except Exception as error:
        line = describe(error)
        if line is None and not debug:
            line = describe_collective_failure(error)  # another process went away: not a bug here
        if debug or line is None:
            raise
        if _prints():
            print(f"error: {printable(line)}", file=sys.stderr)
        return 2


def _stdout_closed() -> bool:
    """Whether the standard output's reader has gone (a pipe whose other end is closed polls as an error);
    if so, stdout is pointed at /dev/null, so that the flush at exit does not fail again."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        closed = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (captured output), or no poll()
        return False
    if closed:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except OSError:
            pass
    return closed


def _prints() -> bool:
    """Only the first process of a launch prints the error every process raised."""
    return os.environ.get("RANK", "0") in ("0", "")
