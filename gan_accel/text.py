"""Text that every layer prints: a line that cannot move the cursor or forge output (:func:`printable`), and how a
duration and a time limit read (:func:`describe_duration`, :func:`time_limit_clause`)."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\n``): what is printed cannot move
    the cursor, recolour the terminal or forge a line of the output."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def describe_duration(seconds: float) -> str:
    """``45 s``, ``14 min``, ``2 h 5 min``: a duration as a person reads it."""
    if seconds < 59.5:  # rounds to a whole second below a minute; 59.7 s reads "1 min", not "60 s"
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h" + (f" {minutes % 60} min" if minutes % 60 else "")


def time_limit_clause(max_time: float, stop: int, warmup_steps: float = 0.0) -> str:
    """What a run's lines add when ``max_time`` ends it near step ``stop``, before its last step: where, how to go
    on, and whether it ends inside the learning-rate warmup of its first ``warmup_steps`` (the schedules follow
    the steps asked for, not the time: a run ended there trains at a fraction of its learning rate throughout)."""
    clause = f"; the time limit ({describe_duration(max_time)}) stops it near step {stop:,}, then --resume latest continues"
    if stop < warmup_steps:
        clause += (f"; it would still be in the learning-rate warmup ({warmup_steps:,.0f} steps) there: ask for "
                   f"--steps near {stop:,} so that the schedules fit the time")
    return clause
