import pytest

from pipelib.trace import Event, Kind, Trace, Tracer


def ev(rank, start, end, kind=Kind.COMPUTE, label="F", **kw):
    return Event(rank, kind, label, start, end, **kw)


def test_idle_and_bubble_are_computed_from_compute_events():
    t = Trace([ev(0, 0, 1), ev(0, 2, 3), ev(1, 1, 2), ev(1, 1.5, 2.5), ev(1, 0, 3, Kind.RECV_WAIT)])
    assert t.span == 3
    assert t.busy(0) == 2 and t.busy(1) == 1.5  # overlap counted once, waiting is not busy
    assert t.idle_fraction(0) == pytest.approx(1 / 3)
    assert t.bubble_fraction() == pytest.approx(1 - 3.5 / 6)


def test_event_rejects_negative_duration_and_names_it():
    with pytest.raises(ValueError, match="rank 3"):
        Event(3, Kind.COMPUTE, "F", 2.0, 1.0)


def test_tracer_take_empties_and_filter():
    tr = Tracer(rank=2)
    tr.record("send", "x", 0, 0, bytes=10, peer=1)
    tr.record(Kind.COMPUTE, "F", 0, 1, stage=0, microbatch=1)
    evs = tr.take()
    assert tr.events == [] and len(evs) == 2 and evs[0].kind is Kind.SEND
    t = Trace(evs)
    assert t.bytes_sent() == 10 and len(t.filter(kind="compute")) == 1
    assert "rank" in t.table() and t.rows()[0]["kind"] == "send"
