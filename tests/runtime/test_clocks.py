"""The two clocks alone: the virtual one moves only by modelled durations, the wall one sleeps."""
import time

import pytest
from sleeps import best_of

from pipelib.runtime.clocks import VirtualClock, WallClock


def test_virtual_clock_moves_only_forward_and_only_when_told():
    c = VirtualClock()
    assert c.virtual and c.now() == 0.0
    assert c.advance(0.5) == (0.0, 0.5)
    assert c.advance(-1.0) == (0.5, 0.5)        # a negative duration takes no time
    assert c.wait_until(0.2) == (0.5, 0.5)      # a deadline in the past does not go back
    assert c.wait_until(2.0) == (0.5, 2.0)
    time.sleep(0.01)
    assert c.now() == 2.0                       # real time passing changes nothing
    c.reset(1.0)
    assert c.now() == 1.0


# Readings of the wall clock are checked between two readings of time.time() taken around them
# (exact, whatever the machine's load); sleeps as tests/runtime/sleeps.py says.
ULP = 1e-6  # time.time() is ~1.8e9 s: its doubles are 2.4e-7 s apart


def test_wallclock_shared_epoch():
    epoch = time.time() - 5
    now = WallClock(epoch).now()
    after = time.time()
    assert 5 - ULP <= now <= after - epoch + ULP


def test_wall_clock_sleeps_to_its_deadlines_and_resets(monkeypatch):
    c = WallClock()
    assert not c.virtual

    def advance():
        start, end = c.advance(0.05)
        return end - start

    best_of(advance, at_least=0.05, at_most=0.05 + 0.01)  # never early; 10 ms late at most
    end = c.now()
    monkeypatch.setattr(time, "sleep", lambda s: pytest.fail(f"slept {s} s for a past deadline"))
    before = c.now()
    start, stop = c.wait_until(end - 1.0)       # already past: returns at once, without sleeping
    assert before <= start <= stop <= c.now()
    monkeypatch.undo()
    t0 = time.time()
    c.reset(10.0)
    now = c.now()
    assert 10.0 - ULP <= now <= 10.0 + (time.time() - t0) + ULP
