"""Argument checks shared by every part of pipelib: errors that name the value and what to pass.

Pure: imports nothing but the standard library, so schedules and simulate can use it.
"""
from __future__ import annotations


def is_int_at_least(value, minimum: int = 1) -> bool:
    """True for an int >= `minimum`; False for anything else, a bool included."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def check_int(value, name: str, *, minimum: int = 1, context: str = "", hint: str = "") -> int:
    """`value` if it is an int >= `minimum` (a bool is not an int here); else a ValueError.

    The message reads `{context}: {name}={value!r}; pass an integer >= {minimum} ({hint})`,
    so the reader sees the value given, the bound, and (with `hint`) what the number means.
    """
    if not is_int_at_least(value, minimum):
        where = f"{context}: " if context else ""
        why = f" ({hint})" if hint else ""
        raise ValueError(f"{where}{name}={value!r}; pass an integer >= {minimum}{why}")
    return value


def check_ints(context: str, minimum: int = 1, **values) -> None:
    """`check_int` on every keyword: `check_ints("ring_bytes", batch=b, heads=h)` names the first
    value that is not an integer >= `minimum`."""
    for name, value in values.items():
        check_int(value, name, minimum=minimum, context=context)


def check_number(value, name: str, *, minimum: float = 0.0, positive: bool = False, context: str = "",
                 hint: str = "") -> float:
    """`value` if it is a finite real number >= `minimum` (> it with `positive`); else a ValueError
    naming it (a bool, a string, NaN and infinity are refused)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    ok = ok and value == value and value not in (float("inf"), float("-inf"))
    ok = ok and (value > minimum if positive else value >= minimum)
    if not ok:
        where = f"{context}: " if context else ""
        why = f" ({hint})" if hint else ""
        bound = f"> {minimum:g}" if positive else f">= {minimum:g}"
        raise ValueError(f"{where}{name}={value!r}; pass a finite number {bound}{why}")
    return value


def check_rank(rank, n: int, context: str = "", name: str = "rank") -> int:
    """`rank` if it is an int in 0..n-1; else a ValueError naming it and the range."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        where = f"{context}: " if context else ""
        raise ValueError(f"{where}{name}={rank!r}; pass an integer in 0..{n - 1} (one of the {n} ranks)")
    return rank


def checked_by(check):
    """Give an engine function its notebook-side check: `Cluster.run(fn, *args, **kwargs)` calls
    `check(world_size, *args, **kwargs)` in the notebook first, so a chapter that calls a step
    straight through the cluster gets every argument error before any engine works."""
    def mark(fn):
        fn.notebook_check = check
        return fn
    return mark
