"""Judging how long a sleep lasted, the way physics allows on a busy machine.

A sleep to a deadline can never end early, so "not before the deadline" is checked exactly, on
every try. It can end late by however long the machine keeps the process waiting for a core
(19 ms was seen under a loaded `make test`), so "not much after" is judged on the best of a few
tries: a late wake-up is chance and does not repeat five times in a row on a machine that has
any time left, while a sleep that really overshoots (a wrong deadline, one padded twice) is late
every time, and still fails.
"""
from __future__ import annotations

TRIES = 5
FLOAT_SLACK = 1e-9  # differences of float times: a deadline met exactly may read 1 ulp short


def best_of(measure, at_least: float, at_most: float, tries: int = TRIES):
    """Call `measure()` (-> seconds, or a list of seconds) until every value is <= `at_most`,
    up to `tries` times; every value of every try must be >= `at_least`. Returns the best try
    (smallest largest value) and fails naming every try's values."""
    seen = []
    for _ in range(tries):
        got = measure()
        values = got if isinstance(got, (list, tuple)) else [got]
        seen.append(values)
        early = [v for v in values if v < at_least - FLOAT_SLACK]
        assert not early, f"ended before its deadline of {at_least} s: {values} (tries so far: {seen})"
        if max(values) <= at_most:
            return got
    raise AssertionError(f"later than {at_most} s in each of {tries} tries (never earlier than "
                         f"{at_least} s, as it must be): {seen}")
