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


def test_event_init_takes_every_field_with_its_default_and_stays_frozen():
    """`Event.__init__` is written by hand (fast); it must take exactly the dataclass's fields,
    in order, with their defaults, so `replace`, `asdict` and equality keep working."""
    import dataclasses
    import inspect

    params = list(inspect.signature(Event).parameters.values())
    fields = dataclasses.fields(Event)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [inspect.Parameter.empty if f.default is dataclasses.MISSING
                                            else f.default for f in fields]
    e = Event(1, Kind.SEND, "x", 0.5, 1.5, peer=2, bytes=8, axis="ep")
    assert dataclasses.replace(e, end=2.0) == Event(1, Kind.SEND, "x", 0.5, 2.0, peer=2, bytes=8, axis="ep")
    assert e.as_dict()["axis"] == "ep" and e.shifted(1.0).start == 1.5 and hash(e) == hash(dataclasses.replace(e))
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.start = 0.0


def test_tracer_take_empties_and_filter():
    tr = Tracer(rank=2)
    tr.record("send", "x", 0, 0, bytes=10, peer=1)
    tr.record(Kind.COMPUTE, "F", 0, 1, stage=0, microbatch=1)
    evs = tr.take()
    assert tr.events == [] and len(evs) == 2 and evs[0].kind is Kind.SEND
    t = Trace(evs)
    assert t.bytes_sent() == 10 and len(t.filter(kind="compute")) == 1
    assert "rank" in t.table() and t.rows()[0]["kind"] == "send"
