"""Communication figures are drawn from SEND events: arrows follow the messages, steps replay
the collective, sweeps show measured bandwidth. Pure: events are built here as the
collectives label them (see tests/comm/test_collectives.py for the same on a live cluster)."""
import math

import pytest

from pipelib.trace import Event, Kind, Trace
from pipelib.viz.comm import (
    collective_animation,
    message_steps,
    replay,
    size_sweep_bandwidth_figure,
    size_sweep_figure,
    step_moves,
)
from pipelib.viz.display import figure_bundle


def _send(rank, peer, label, nbytes=8):
    return Event(rank, Kind.SEND, label, 0.0, 0.0, bytes=nbytes, peer=peer)


def _ring_all_reduce(n):
    """The messages of pipelib.comm.collectives.all_reduce on n ranks, as its trace labels them."""
    evs = []
    for s in range(n - 1):
        for r in range(n):
            evs.append(_send(r, (r + 1) % n, f"all_reduce reduce-scatter step {s} chunk {(r - s - 1) % n}"))
    for s in range(n - 1):
        for r in range(n):
            evs.append(_send(r, (r + 1) % n, f"all_reduce all-gather step {n - 1 + s} chunk {(r - s) % n}"))
    return Trace(evs, n)


def _all_to_all(n):
    evs = [_send(r, (r + s) % n, f"all_to_all all-to-all step {s - 1} chunk {(r + s) % n}")
           for s in range(1, n) for r in range(n)]
    return Trace(evs, n)


def _naive(n):
    evs = [_send(r, (r + 1) % n, f"all_reduce_naive forward step {s} chunk {(r - s) % n}")
           for s in range(n - 1) for r in range(n)]
    return Trace(evs, n)


def test_ring_moves_one_chunk_per_column_to_the_right_neighbour():
    n = 4
    rows = message_steps(_ring_all_reduce(n), "all_reduce")
    moves = step_moves(rows, "all_reduce", n)
    assert list(moves) == list(range(2 * (n - 1)))
    for ms in moves.values():
        assert sorted(m["src_slot"] for m in ms) == list(range(n))      # every chunk moves once
        assert all(m["dst"] == (m["src"] + 1) % n and m["src_slot"] == m["dst_slot"] for m in ms)
    final = replay(rows, "all_reduce", n)[-1]
    assert all(cell == frozenset(range(n)) for row in final for cell in row)


def test_all_to_all_moves_transpose_the_grid():
    n = 3
    moves = step_moves(message_steps(_all_to_all(n), "all_to_all"), "all_to_all", n)
    for ms in moves.values():
        for m in ms:
            assert (m["src_slot"], m["dst_slot"]) == (m["dst"], m["src"])
    cells = {(m["dst"], m["dst_slot"]) for ms in moves.values() for m in ms}
    assert cells == {(r, s) for r in range(n) for s in range(n) if r != s}


def _segments(arrows, gap=0.22):
    """(x0, y0, x1, y1) of each arrow of an arrow trace, its shortened ends extended back."""
    xs, ys, out = list(arrows.x), list(arrows.y), []
    for i in range(0, len(xs), 3):
        (tx, ty), (hx, hy) = (xs[i], ys[i]), (xs[i + 1], ys[i + 1])
        d = math.hypot(hx - tx, hy - ty)
        ux, uy = (hx - tx) / d, (hy - ty) / d
        out.append((round(tx - gap * ux, 9), round(ty - gap * uy, 9), round(hx + gap * ux, 9), round(hy + gap * uy, 9)))
    return out


def test_animation_draws_each_steps_messages_as_arrows():
    n = 4
    fig = collective_animation(_ring_all_reduce(n), "all_reduce")
    assert len(fig.frames) == 2 * (n - 1) + 1
    assert all(len(f.data) == 2 for f in fig.frames)          # heatmap + arrows in every frame
    assert list(fig.frames[0].data[1].x) == []                # before the first step: no message
    rows = message_steps(_ring_all_reduce(n), "all_reduce")
    for i, frame in enumerate(fig.frames[1:]):
        sent = [r for r in rows if r["step"] == i]
        # each arrow starts on the sender's row and ends on the receiver's, in the chunk's column
        assert sorted(_segments(frame.data[1])) == sorted((m["chunk"], m["src"], m["chunk"], m["dst"]) for m in sent)
        assert list(frame.data[1].marker.size) == [0, 13, 0] * len(sent)   # an arrow head at the receiver
        assert f"step {i} " in frame.layout.title.text
    assert _segments(fig.data[1]) == _segments(fig.frames[-1].data[1])   # the static view: last step
    assert " B each" in fig.frames[1].layout.title.text
    z_before, z_after = fig.frames[0].data[0].z, fig.frames[-1].data[0].z
    assert all(v == 1 / n for row in z_before for v in row) and all(v == 1 for row in z_after for v in row)


def test_arrows_sharing_a_column_are_spread_apart():
    n = 3
    fig = collective_animation(_naive(n), "all_reduce_naive")
    segs = _segments(fig.frames[1].data[1])
    assert len(segs) == n and len({x0 for x0, _, _, _ in segs}) == n     # no arrow hides another
    assert all(x0 == x1 for x0, _, x1, _ in segs)                          # still vertical
    assert sorted((y0, y1) for _, y0, _, y1 in segs) == [(0, 1), (1, 2), (2, 0)]
    bare = collective_animation(_naive(n), "all_reduce_naive", arrows=False)
    assert list(bare.frames[1].data[1].x) == []


def test_steps_with_fewer_messages_draw_fewer_arrows():
    n = 4  # binomial broadcast: 1 message at step 0, 2 at step 1
    evs = [_send(0, 1, "broadcast broadcast step 0 chunk 0"),
           _send(0, 2, "broadcast broadcast step 1 chunk 0"), _send(1, 3, "broadcast broadcast step 1 chunk 0")]
    fig = collective_animation(Trace(evs, n), "broadcast")
    assert [len(f.data[1].x) // 3 for f in fig.frames] == [0, 1, 2]
    assert [row[0] for row in replay(message_steps(Trace(evs, n), "broadcast"), "broadcast", n)[-1]] == [{0}] * n


def test_animation_refuses_a_trace_without_the_collective():
    with pytest.raises(ValueError, match="no messages of collective 'broadcast'"):
        collective_animation(_naive(3), "broadcast")


def test_bandwidth_sweep_divides_bytes_by_time_and_marks_lines_on_both_panels():
    sizes, times = [1000, 10**6], [1e-3, 2e-3]
    fig = size_sweep_bandwidth_figure({"ours": (sizes, times)}, {"model": (sizes, [5e-4, 1e-3])},
                                      vlines={"crossover": 10**4})
    ours_bw = [t for t in fig.data if t.name == "ours" and t.xaxis == "x2"][0]
    assert list(ours_bw.y) == pytest.approx([1e-3, 0.5])               # GB/s = bytes / s / 1e9
    assert [t.showlegend for t in fig.data if t.name == "ours"] == [None, False]  # one legend entry
    # plotly.js: a shape on a log axis in data units, an annotation in log10 units
    assert [(s.x0, s.x1, s.xref) for s in fig.layout.shapes] == [(10**4, 10**4, "x"), (10**4, 10**4, "x2")]
    assert [(a.x, a.xref) for a in fig.layout.annotations if a.text == "crossover"] == [(4.0, "x")]
    b1, b2 = figure_bundle(fig), figure_bundle(size_sweep_bandwidth_figure(
        {"ours": (sizes, times)}, {"model": (sizes, [5e-4, 1e-3])}, vlines={"crossover": 10**4}))
    assert b1 == b2


def test_size_sweep_figure_keeps_its_old_signature():
    fig = size_sweep_figure({"a": ([1, 10], [1.0, 2.0])}, None, "t", "s")
    assert list(fig.data[0].y) == [1.0, 2.0] and not fig.layout.shapes
    fig = size_sweep_figure({"a": ([1, 1000], [1.0, 2.0])}, vlines={"x": 100})
    assert fig.layout.shapes[0].x0 == 100 and math.isclose(fig.layout.annotations[0].x, 2.0)


def test_segments_of_one_chunk_are_one_move_with_all_their_bytes():
    """On a real device the ring sends each chunk as several segment messages, same label."""
    n = 2
    evs = [_send(r, 1 - r, f"all_gather all-gather step 0 chunk {r}", nbytes=b)
           for r in range(n) for b in (100, 100, 56)]
    rows = message_steps(Trace(evs, n), "all_gather")
    assert len(rows) == 6
    moves = step_moves(rows, "all_gather", n)
    assert [(m["src"], m["bytes"], m["messages"]) for m in moves[0]] == [(0, 256, 3), (1, 256, 3)]
    fig = collective_animation(Trace(evs, n), "all_gather")
    assert len(fig.frames[1].data[1].x) == 3 * n and "256 B each" in fig.frames[1].layout.title.text


def test_animation_columns_can_be_named_and_must_match_the_slots():
    """Chapter 17 names its one column (the K/V blocks a rank has held); a wrong count is an error."""
    default = collective_animation(_ring_all_reduce(4), "all_reduce")
    names = [f"block {c}" for c in range(4)]
    named = collective_animation(_ring_all_reduce(4), "all_reduce", columns=names)
    assert list(named.layout.xaxis.ticktext) == names and list(default.layout.xaxis.ticktext) != names
    with pytest.raises(ValueError, match="names 2 slots"):
        collective_animation(_ring_all_reduce(4), "all_reduce", columns=["a", "b"])
