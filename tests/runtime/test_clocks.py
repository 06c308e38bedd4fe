"""The two clocks alone: the virtual one moves only by modelled durations, the wall one sleeps."""
import time

import pytest

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


def test_wallclock_shared_epoch():
    epoch = time.time() - 5
    assert WallClock(epoch).now() == pytest.approx(5, abs=0.05)


def test_wall_clock_sleeps_to_its_deadlines_and_resets():
    c = WallClock()
    assert not c.virtual
    start, end = c.advance(0.05)
    assert end - start == pytest.approx(0.05, abs=0.01)
    start, end = c.wait_until(end - 1.0)        # already past: returns at once
    assert end - start < 0.01
    c.reset(10.0)
    assert c.now() == pytest.approx(10.0, abs=0.01)
