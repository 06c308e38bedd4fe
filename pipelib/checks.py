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
