"""Every figure function of pipelib, built from small real inputs, goes through `figure_bundle`
the way the book and JupyterLab receive it: the plotly mimetype is plotly's own JSON encoding
(numpy arrays kept as arrays, not strings: JupyterLab piled every bar at t = 0), the HTML div's
id comes from that JSON (a re-run is byte-identical), nothing plays on its own, and an animated
figure first shows its final state. A new figure function without a sample input here fails
`test_every_figure_function_has_a_sample`."""
import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

import pipelib.viz as viz
from pipelib.hardware.roofline import MeasuredOp, Roofline
from pipelib.hf.tokenizer import TokenizerRow
from pipelib.pipeline import explorer
from pipelib.pipeline.schedules import make_schedule
from pipelib.pipeline.simulate import Costs, simulate
from pipelib.topology import Topology
from pipelib.trace import Event, Kind, Trace
from pipelib.viz.display import figure_bundle, frame_ms

PLOTLY = "application/vnd.plotly.v1+json"


def _sim(name="1f1b", p=4, m=8, v=1, f=1e-3):
    """A simulated step in seconds (F = 1 ms), as chapters 10-13 draw them."""
    costs = Costs(F=f, B=2 * f, I=f, W=f, activation_bytes=1).scaled(1 / v)
    return simulate(make_schedule(name, p, m, v), costs).events


def _ring(n=4):
    """The SEND events of pipelib.comm.collectives.all_reduce on n ranks, labelled as it does."""
    evs = [Event(r, Kind.SEND, f"all_reduce {phase} step {s + off} chunk {(r - s - d) % n}", 1e-3 * s,
                 1e-3 * s + 1e-4, bytes=64, peer=(r + 1) % n)
           for phase, off, d in (("reduce-scatter", 0, 1), ("all-gather", n - 1, 0))
           for s in range(n - 1) for r in range(n)]
    return Trace(evs, n)


SIZES = np.array([2**10, 2**14, 2**18, 2**22])  # numpy, as measured sweeps hand them over
TIMES = np.array([3e-5, 8e-5, 9e-4, 1.2e-2])

def _ddp(overlap: bool, n=2):
    """A DDP step as chapter 07 records it: F, B, all-reduces on the comm lane, the wait."""
    evs = []
    for r in range(n):
        evs += [Event(r, Kind.COMPUTE, "F", 0, 1e-3), Event(r, Kind.COMPUTE, "B", 1e-3, 3e-3),
                Event(r, Kind.COLLECTIVE, "all_reduce", 2e-3 if overlap else 3e-3, 4e-3 if overlap else 5e-3, bytes=64),
                Event(r, Kind.RECV_WAIT, "wait all-reduce", 3e-3, 4e-3 if overlap else 5e-3),
                Event(r, Kind.RECV_WAIT, "all_reduce step 0", 3e-3, 3.5e-3)]
    return Trace(evs, n)


SAMPLES = {
    "roofline_figure": lambda: viz.roofline_figure(
        [Roofline("cpu", 1e11, 2e10)], [MeasuredOp("matmul", 2e9, 3e7, 0.05)]),
    "bandwidth_figure": lambda: viz.bandwidth_figure(
        list(zip(SIZES, np.array([9e10, 6e10, 3e10, 1.5e10]))), caches=((1, "Data", 48 * 1024), (2, "Unified", 2**20))),
    "timeline_figure": lambda: viz.timeline_figure(_sim(), "1F1B, p=4, m=8", frames=6),
    "sweep_figure": lambda: viz.sweep_figure({s: _sim(s, 4, 8, v) for s, v in (("gpipe", 1), ("1f1b", 1), ("zbv", 2))},
                                             "p=4, m=8, simulated", param="schedule"),
    "memory_figure": lambda: viz.memory_figure(_sim("gpipe"), "activations", per=1, yaxis_title="microbatches"),
    "speedup_figure": lambda: viz.speedup_figure({"measured": (np.arange(1, 5), np.array([1.0, 1.8, 2.4, 2.9]))},
                                                 {"Amdahl": (np.arange(1, 5), 1 / (0.2 + 0.8 / np.arange(1, 5)))}),
    "collective_animation": lambda: viz.collective_animation(_ring(), "all_reduce"),
    "pingpong_figure": lambda: viz.pingpong_figure(
        [{"bytes": b, "time": t, "bandwidth": b / t} for b, t in zip(SIZES, TIMES)], 2e-5, 4e8, "ping-pong"),
    "size_sweep_figure": lambda: viz.size_sweep_figure({"ring": (SIZES, TIMES)}, {"model": (SIZES, TIMES * 0.9)},
                                                       vlines={"crossover": 2**16}),
    "size_sweep_bandwidth_figure": lambda: viz.size_sweep_bandwidth_figure({"ring": (SIZES, TIMES)},
                                                                           {"model": (SIZES, TIMES * 0.9)}),
    "recompute_memory_figure": lambda: viz.recompute_memory_figure(
        {"none": [(0, 0, "forward"), (10, 5, "forward"), (30, 0, "backward")]}),
    "tradeoff_figure": lambda: viz.tradeoff_figure(
        [{"label": "full", "extra": 0.3, "peak": 2**20, "predicted": 2**20}]),
    "bucket_sweep_figure": lambda: viz.bucket_sweep_figure(
        [{"bucket_bytes": b, "buckets": 4 - i, "after": t, "overlap": 0.8 * t, "model": t}
         for i, (b, t) in enumerate(zip(SIZES, TIMES))],
        {"after": "after backward", "overlap": "overlapped"}, predicted={"model": "model"}),
    "efficiency_figure": lambda: viz.efficiency_figure({"PCIe": (SIZES, np.array([0.1, 0.4, 0.6, 0.7]))},
                                                       {"PCIe": (SIZES, np.array([0.1, 0.4, 0.6, 0.7]))},
                                                       bands={"seed": (0.7, 0.8)}),
    "ranks_figure": lambda: viz.ranks_figure(SIZES, {"PCIe": np.array([3.0, 1.5, 0.9, 0.7])}, crossover=2**18),
    "ddp_timelines_figure": lambda: viz.ddp_timelines_figure({"after": _ddp(False), "overlapped": _ddp(True)}),
    "zero_memory_figure": lambda: viz.zero_memory_figure(
        [{"stage": s, "measured": {"parameters": 4e6 / d, "gradients": 4e6 / d, "optimizer": 8e6 / d},
          "formula": {"parameters": 4e6 / d, "gradients": 4e6 / d, "optimizer": 8e6 / d}} for s, d in ((0, 1), (3, 2))],
        capacity=12_000_000),
    "milestone_figure": lambda: viz.milestone_figure(1e10, [1, 2, 8], {0: [160, 160, 160], 3: [160, 80, 20]}),
    "loss_curves_figure": lambda: viz.loss_curves_figure({"one process": [4.5, 3.1, 2.6], "ZeRO-2": [4.5, 3.1, 2.6]}),
    "tp_split_figure": lambda: viz.tp_split_figure(8, 6, 2),
    "tp_collectives_figure": lambda: viz.tp_collectives_figure(Trace(
        [Event(0, Kind.COLLECTIVE, f"all_reduce: block {i} {d}", 1e-3 * j, 1e-3 * j + 1e-4, bytes=4096)
         for j, (i, d) in enumerate((i, d) for d in ("forward", "backward") for i in range(2))], 1)),
    "tp_link_share_figure": lambda: viz.tp_link_share_figure(
        [{"link": l, "t": t, "share": s, "ms": 50 * s}
         for l, s in (("nvlink4", 0.01), ("pcie5", 0.05)) for t in (2, 8)]),
    "tp_memory_figure": lambda: viz.tp_memory_figure(
        [{"setting": "t=1", "measured": 74240, "counted": 74240},
         {"setting": "t=2 TP", "measured": 45568, "counted": None}]),
    "work_figure": lambda: viz.work_figure({"zigzag": _sim("1f1b"), "contiguous": _sim("gpipe")}),
    "overlap_figure": lambda: viz.overlap_figure(
        [{"shard_len": c, "hidden": h, "step_over_compute": t}
         for c, h, t in ((64, 0.4, 1.6), (256, 1.0, 1.0))], 146.6),
    "context_figure": lambda: viz.context_figure({1: 646, 2: 1292}, {1: 646, 2: 1292, 4: 2584, 8: 5168}),
    "variants_figure": lambda: viz.variants_figure(
        {"ring": {"bytes": 3 * 2**16, "peak_memory": 2**20, "time": 2e-3},
         "ulysses": {"bytes": 2**16, "peak_memory": 2**21, "time": 1.5e-3}}),
    "traffic_figure": lambda: viz.traffic_figure([[[0, 3], [1, 0]], [[2, 5], [2, 0]]]),
    "load_figure": lambda: viz.load_figure({"none": [1.5, 4.0], "bias": [1.5, 2.0]}),
    "drop_rate_figure": lambda: viz.drop_rate_figure([0.5, 1.0], {"none": [0.5, 0.25]}),
    "mesh_figure": lambda: viz.mesh_figure(Topology(dp=2, tp=2, pp=2), gpus_per_node=4),
    "axis_timeline_figure": lambda: viz.axis_timeline_figure(Trace(
        [Event(0, Kind.COMPUTE, "F", 0.0, 1.0), Event(0, Kind.COLLECTIVE, "all_reduce", 1.0, 1.5, bytes=64, axis="tp"),
         Event(1, Kind.TRANSFER, "act", 1.0, 1.2, bytes=32, peer=0, axis="pp")], 2)),
    "orders_figure": lambda: viz.orders_figure(
        [{"order": o, "axis": a, "measured": 1e-3, "predicted": 1.1e-3} for o in ("pp>dp>tp", "dp>pp>tp")
         for a in ("dp", "pp")]),
    "rank_memory_figure": lambda: viz.rank_memory_figure(
        [4 * 2**20, 2 * 2**20], [{"parameters": 2**20, "activations": 3 * 2**20}, {"parameters": 2**20}]),
    "plans_figure": lambda: viz.plans_figure(_plans()[:3]),
    "plans_explorer_figure": lambda: viz.plans_explorer_figure({"GPT-3": _plans()[:3], "again": _plans()[3:5]}),
    "lost_time_figure": lambda: viz.lost_time_figure([60, 600, 6000], [0.2, 0.05, 0.3], 900, 950, 0.04),
    "lost_rank_figure": lambda: viz.lost_rank_figure({"a": [4.2, 4.1, 4.0], "b": [4.2, 4.1, 4.05]}, {"b": [2, 2, 1]},
                                                     2),
    "save_time_figure": lambda: viz.save_time_figure([{"mib": 16, "seconds": 0.05}, {"mib": 64, "seconds": 0.17}]),
    "explorer_figures": lambda: explorer.explorer_figures("zbv", 4, 8),
    "explorer_sweep": lambda: explorer.explorer_sweep("m", [2, 4, 8], schedule="1f1b", p=4),
    "tokenizer_figure": lambda: viz.tokenizer_figure(
        [TokenizerRow("characters", 100, 28_894, 28_894, 12_800, 144_192),
         TokenizerRow("BPE 512", 512, 13_406, 28_894, 65_536, 196_928)]),
}


def _plans():
    from pipelib.costmodel import LINKS, PROFILES
    from pipelib.planner.search import search
    from pipelib.planner.spec import GPT3_175B, Machine

    return search(GPT3_175B, Machine(PROFILES["a100"], 8, LINKS["ib-ndr"]), 1024, 1536)[:5]


def _figure_functions() -> set[str]:
    """Every public figure function: pipelib.viz's API ending in _figure or _animation, and the
    explorer's public functions that return figures (explorer_figures, explorer_sweep)."""
    found = {n for n in viz.API if n.endswith(("_figure", "_animation"))}
    found |= {n for n in explorer.__all__ if n.endswith(("_figure", "_figures", "_animation", "_sweep"))}
    return found


def _figures(name):
    out = SAMPLES[name]()
    figs = list(out) if isinstance(out, tuple) else [out]
    assert figs and all(isinstance(f, go.Figure) for f in figs), f"{name} returned {type(out)}"
    return figs


def test_every_figure_function_has_a_sample():
    found = _figure_functions()
    assert {"timeline_figure", "sweep_figure", "collective_animation", "explorer_sweep"} <= found
    assert found == set(SAMPLES), (f"figure functions without a sample input in SAMPLES: "
                                   f"{sorted(found - set(SAMPLES))}; samples of no figure function: "
                                   f"{sorted(set(SAMPLES) - found)}")


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_bundle_carries_plotlys_own_json_and_a_stable_id(name):
    figs = _figures(name)
    bundles = [figure_bundle(f) for f in figs]
    for fig, bundle in zip(figs, bundles):
        spec = bundle[PLOTLY]
        assert {k: v for k, v in spec.items() if k != "config"} == json.loads(pio.to_json(fig))
        assert spec["config"]["displaylogo"] is False
        html = bundle["text/html"]
        div = html.split('id="', 1)[1].split('"', 1)[0]
        assert div.startswith("fig-") and div in bundle["text/plain"] and "cdn" not in html.lower()
        assert "Plotly.animate" not in html                   # nothing autoplays in the book
    assert [figure_bundle(f) for f in _figures(name)] == bundles   # a re-run: byte-identical


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_animations_show_their_final_state_and_wait_for_play(name):
    for fig in _figures(name):
        if not fig.frames:
            continue
        n = len(fig.frames)
        spec = json.loads(pio.to_json(fig))
        last = spec["frames"][-1]
        for i, partial in zip(last.get("traces", range(len(last["data"]))), last["data"]):
            for key, value in partial.items():
                assert spec["data"][i].get(key) == value, (name, i, key)   # the figure = its last frame
        (play,) = fig.layout.updatemenus[0].buttons
        frame_opts = play.args[1]
        assert play.args[0] is None and frame_opts["fromcurrent"] is False       # from the start
        assert frame_opts["frame"]["duration"] == frame_ms(n) and frame_opts["transition"]["duration"] == 0
        assert 2000 <= n * frame_ms(n) <= 5000 or frame_ms(n) == 1000            # a few seconds in all
        assert fig.layout.sliders[0].active == n - 1


def test_numpy_arrays_reach_jupyterlab_as_arrays():
    """The bug: json.dumps(default=str) wrote a numpy `base` as the string "[0. 1. 2.]"."""
    fig = go.Figure(go.Bar(orientation="h", base=np.array([0.0, 1.5, 3.0]), x=np.array([1.0, 1.0, 2.0]),
                           y=["rank 0", "rank 1", "rank 0"]))
    spec = figure_bundle(fig)[PLOTLY]
    assert spec["data"][0]["base"] == json.loads(pio.to_json(fig))["data"][0]["base"]
    assert not isinstance(spec["data"][0]["base"], str)


def test_big_timelines_stay_small():
    """Chapter pages must stay under 1.5 MB: an 8-rank ZB-V step of 16 microbatches, animated,
    and a sweep over 8 schedules, fit in a few hundred kB of HTML each."""
    zbv = viz.timeline_figure(_sim("zbv", 8, 16, 2), "ZB-V")
    assert len(figure_bundle(zbv)["text/html"]) < 200_000
    names = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1), ("zb_h2", 1),
             ("interleaved_zero_bubble", 2), ("zbv", 2), ("dualpipe_v", 2)]
    sweep = viz.sweep_figure({s: _sim(s, 8, 16, v) for s, v in names}, "p=8, m=16", param="schedule")
    assert len(figure_bundle(sweep)["text/html"]) < 300_000
