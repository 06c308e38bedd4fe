"""pipelib.hardware: roofline arithmetic exact, measurements positive and sane, a live ping-pong;
the figures of pipelib.viz.hardware build."""
import math
import os

import pytest

from pipelib.costmodel import PROFILES, MiB
from pipelib.hardware.bandwidth import measure_stream, read_bandwidth_curve
from pipelib.hardware.compute import measure_attention, measure_matmul, measure_softmax
from pipelib.hardware.machine import best_time, cpu_sharing, machine_info
from pipelib.hardware.network import pingpong_times, summarize_pingpong
from pipelib.hardware.published import PUBLISHED, comparison_markdown, fmt
from pipelib.hardware.roofline import MeasuredOp, Roofline
from pipelib.hardware.storage import file_read_bandwidth


# ----------------------------------------------------------------------------- roofline math
def test_roofline_arithmetic_on_round_numbers():
    r = Roofline("toy", peak=100e9, bandwidth=10e9)
    assert r.ridge == 10.0
    assert r.attainable(1.0) == 10e9          # memory roof: bandwidth * I
    assert r.attainable(10.0) == 100e9        # the ridge: both roofs
    assert r.attainable(1000.0) == 100e9      # compute roof
    assert r.time(flops=100e9, nbytes=1e9) == 1.0    # compute-bound: 1 s of FLOPs, 0.1 s of bytes
    assert r.time(flops=1e9, nbytes=10e9) == 1.0     # memory-bound
    assert r.bound(0.5) == "memory-bound" and r.bound(50) == "compute-bound"


def test_roofline_matches_the_costmodel_profile():
    for name in ("h100", "a100", "toy-gpu"):
        r, p = Roofline.from_profile(name), PROFILES[name]
        assert r.ridge == p.ridge_point
        for flops, nbytes in [(1e12, 1e9), (1e9, 1e12), (0, 5e6), (3e10, 0)]:
            assert r.time(flops, nbytes) == p.compute_time(flops, nbytes)
    assert round(Roofline.from_profile("h100").ridge) == 295  # 989e12 / 3.35e12


def test_measured_op_intensity_and_roofline_from_ops():
    mm = MeasuredOp("matmul", flops=2 * 64**3, nbytes=3 * 64 * 64 * 4, seconds=1e-3)
    add = MeasuredOp("add", flops=1000, nbytes=12000, seconds=1e-6)
    assert mm.intensity == pytest.approx(64 * 2 / 12)  # 2n^3 / (12 n^2) = n / 6
    assert mm.achieved == 2 * 64**3 / 1e-3
    assert add.bandwidth == 12000 / 1e-6
    r = Roofline.from_ops("measured", [mm], [add])
    assert (r.peak, r.bandwidth) == (mm.achieved, add.bandwidth)


def test_pingpong_summary_keeps_the_best_of_repeats():
    times = {8: [3e-5, 1e-5, 2e-5, 9.0], 1024: [4e-5] * 3, 2**20: [1e-3, 2e-3, 5e-4]}
    m = summarize_pingpong(times)
    assert m.sizes == (8, 1024, 2**20)
    assert m.one_way == (1e-5, 4e-5, 5e-4)  # a busy machine only adds time: the 9 s outlier is noise
    assert m.latency == 1e-5 and m.bandwidth == 2**20 / 5e-4
    assert m.link("lo").time(0) == m.latency


def test_published_figures_carry_sources_and_match_the_costmodel():
    by = {(p.item, p.quantity): p for p in PUBLISHED}
    assert by["H100 SXM", "compute, BF16 dense"].value == 989e12
    assert by["H100 SXM", "memory bandwidth (HBM3)"].value == 3.35e12
    assert by["NVLink 4 (H100)", "GPU-to-GPU, both directions"].value == 900e9
    assert by["PCIe 5.0 x16", "CPU-to-GPU, per direction"].value == 64e9
    assert by["InfiniBand NDR", "node-to-node, per port, per direction"].value * 8 == 400e9
    assert all(p.source and p.value > 0 for p in PUBLISHED)
    assert fmt(989e12, "FLOP/s") == "989 TFLOP/s" and fmt(3.35e12, "B/s") == "3.35 TB/s"
    table = comparison_markdown({"matmul": (1e11, "FLOP/s")}, "a laptop")
    assert "100 GFLOP/s" in table and table.count("\n") == len(PUBLISHED) + 2


# ----------------------------------------------------------------------------- measurements
def test_machine_info_names_the_machine():
    info = machine_info()
    assert info.cpu and info.cores >= 1 and info.memory_bytes > 0
    assert info.cpu in info.label


def test_matmul_measurement_is_positive_and_below_any_sane_peak():
    op = measure_matmul(128, threads=1, repeats=2)
    assert op.flops == 2 * 128**3 and op.nbytes == 3 * 128 * 128 * 4
    assert 1e7 < op.achieved < 1e13  # 10 MFLOP/s .. 10 TFLOP/s on one CPU core


def test_stream_and_softmax_and_attention_counts():
    n = 2**20
    copy, triad = (measure_stream(k, n, threads=1, repeats=2) for k in ("copy", "triad"))
    assert (copy.flops, copy.nbytes) == (0, 8 * n)
    assert (triad.flops, triad.nbytes) == (2 * n, 12 * n)
    assert 1e8 < triad.bandwidth < 1e13
    with pytest.raises(ValueError, match="kind must be one of"):
        measure_stream("scale", 8)
    sm = measure_softmax(64, 128, threads=1, repeats=2)
    assert sm.intensity == 5 / 8
    h, T, d = 2, 64, 16
    wo = measure_attention(h, T, d, written_out=True, threads=1, repeats=2)
    fused = measure_attention(h, T, d, written_out=False, threads=1, repeats=2)
    assert wo.flops == fused.flops == 4 * h * T * T * d + 5 * h * T * T
    assert wo.nbytes - fused.nbytes == 4 * 4 * h * T * T  # the score matrix's round trips
    assert wo.seconds > 0 and fused.seconds > 0


def test_read_bandwidth_curve_is_positive():
    curve = read_bandwidth_curve([16 * 1024, 1 * MiB], total_bytes=8 * MiB, repeats=2)
    assert [s for s, _ in curve] == [16 * 1024, MiB]
    assert all(1e8 < b < 1e13 for _, b in curve)


def test_file_read_bandwidth_cleans_up(tmp_path):
    r = file_read_bandwidth(4 * MiB, directory=str(tmp_path), chunk=MiB)
    assert r.nbytes == 4 * MiB
    assert r.cached_bps > 1e7 and r.write_bps > 1e5
    assert r.evicted_bps is None or r.evicted_bps > 1e5
    assert os.listdir(tmp_path) == []


def test_best_time_takes_the_fastest_repeat():
    calls = []
    t = best_time(lambda: calls.append(1), repeats=3, min_seconds=0.0)
    assert t >= 0 and len(calls) >= 4  # warm-up + calibration + repeats


def test_figures_build():
    from pipelib.viz.hardware import bandwidth_figure, roofline_figure

    ops = [MeasuredOp("a", 10, 1, 1e-9), MeasuredOp("b", 1, 10, 1e-9)]
    fig = roofline_figure([Roofline("r", 1e10, 1e9)], ops)
    assert len(fig.data) == 2 and fig.layout.xaxis.type == "log"
    curve_fig = bandwidth_figure([(1024, 1e10), (2048, 2e10)], caches=((1, "Data", 48 * 1024),))
    assert len(curve_fig.data) == 1


# ----------------------------------------------------------------------------- live link
@pytest.mark.cluster
def test_pingpong_between_two_cpu_engines(cpu2):
    sizes = [8, 4096, MiB]
    results = cpu2.run(pingpong_times, sizes, 3)
    assert results[1] is None
    times = results[0]
    # small messages are sampled 8x more (a busy machine's best case needs more tries)
    assert sorted(times) == sizes and [len(times[n]) for n in sizes] == [24, 24, 3]
    m = summarize_pingpong(times)
    assert 0 < m.latency < 0.1                 # loopback: microseconds to milliseconds
    assert 1e6 < m.bandwidth < 1e12             # and MB/s to GB/s
    assert m.one_way[-1] > m.one_way[0] * 0.5   # a MiB is not faster than 8 bytes by much
    assert math.isfinite(m.link().time(2**20))


def test_cpu_sharing_reads_this_machine():
    s = cpu_sharing()
    assert s.cores >= 1 and s.running >= 1 and s.load_1min >= 0 and s.busy_elsewhere >= 0
    assert s.hyperthreads in (True, False, None)
