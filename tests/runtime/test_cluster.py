"""The engine cluster: ranks, faults as errors naming the rank, no orphans, clocks."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from leftovers import cluster_processes
from sleeps import best_of

from pipelib.runtime.cluster import Cluster
from pipelib.runtime.errors import RankDiedError, RankError, RankTimeoutError

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("kwargs, match", [
    (dict(world_size=0), r"Cluster: world_size=0; pass an integer >= 1"),
    (dict(world_size=-2), r"world_size=-2; pass an integer >= 1"),
    (dict(world_size=2.5), r"world_size=2\.5; pass an integer >= 1"),
    (dict(world_size=True), r"world_size=True; pass an integer >= 1"),
    (dict(world_size=65), r"world_size=65; pass at most 64"),
    (dict(world_size=2, device="tpu"), "unknown device 'tpu'"),
    (dict(world_size=2, profile="b200-typo"), "unknown device profile 'b200-typo'"),
    (dict(world_size=2, clock="lunar"), "unknown clock 'lunar'"),
    (dict(world_size=2, timeout=0), "timeout must be a positive number"),
    (dict(world_size=3, device="cuda"), "world_size=3 but this machine has 0 GPU"),
])
def test_bad_arguments_raise_before_any_process_starts(kwargs, match):
    before = set(cluster_processes())
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match=match):
        Cluster(**kwargs)
    assert set(cluster_processes()) <= before
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children


def test_ranks_threads_and_results_in_rank_order(cluster4):
    import torch.distributed as dist

    assert cluster4.run(dist.get_rank) == [0, 1, 2, 3]
    assert [i["threads"] for i in cluster4.info] == [1, 1, 1, 1]
    assert len(set(cluster4.pids)) == 4


def _allreduce_rank():
    import torch
    import torch.distributed as dist

    x = torch.full((3,), float(dist.get_rank()))
    dist.all_reduce(x)
    return x.tolist()


def test_collective_runs(cluster4):
    assert cluster4.run(_allreduce_rank) == [[6.0, 6.0, 6.0]] * 4


def _raise_on(rank):
    import torch.distributed as dist

    if dist.get_rank() == rank:
        raise ValueError(f"bad value on purpose on rank {rank}")
    return dist.get_rank()


def test_exception_names_rank_and_cluster_stays_usable(cluster4):
    with pytest.raises(RankError, match=r"rank 2 raised ValueError: bad value on purpose") as err:
        cluster4.run(_raise_on, 2)
    assert set(err.value.errors) == {2} and "_raise_on" in str(err.value)
    assert cluster4.run(_raise_on, -1) == [0, 1, 2, 3]


def _stall(rank, seconds):
    import time

    import torch.distributed as dist

    if dist.get_rank() == rank:
        time.sleep(seconds)
    return dist.get_rank()


def test_stalled_rank_times_out_naming_rank_and_activity(cluster4):
    t0 = time.monotonic()
    stuck = r"rank 1 did not finish _stall within 1\.5 s; it was doing: running _stall"
    with pytest.raises(RankTimeoutError, match=stuck) as err:
        cluster4.run(_stall, 1, 600, timeout=1.5)
    assert err.value.ranks == [1] and time.monotonic() - t0 < 6
    assert cluster4.run(_stall, -1, 0) == [0, 1, 2, 3]  # interrupted, usable again


def test_every_socket_of_the_cluster_is_on_loopback(cluster4):
    """Controller and engines, gloo's connections included: nothing is reachable from another
    host (the rendezvous is a file, no socket; listening sockets alone: test_loopback.py)."""
    from pipelib.runtime.watchdog import tagged_processes

    cluster4.run(_allreduce_rank)  # gloo's connections made
    sockets = [(p.pid, c.laddr) for p in tagged_processes(cluster4.tag)
               for c in p.net_connections(kind="inet") if c.laddr]
    assert len(sockets) >= 8 and {pid for pid, _ in sockets} >= set(cluster4.pids)
    assert [(pid, a) for pid, a in sockets if not _loopback(a.ip)] == []


def _loopback(ip: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip)
    return getattr(address, "ipv4_mapped", None) is not None and address.ipv4_mapped.is_loopback \
        or address.is_loopback


def _traced_step():
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current
    dev, rank = current(), dist.get_rank()
    x = torch.ones(1000)
    with dev.compute("work", flops=1e6 * (4 - rank)):
        pass
    if rank == 0:
        comms.send(x, 1)
    elif rank == 1:
        comms.recv(x, 0)
    return dev.now()


def test_virtual_clock_gives_identical_timelines_even_under_load(cluster4):
    ends, first = cluster4.measured(_traced_step)  # reset, run, trace
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        again, second = cluster4.measured(_traced_step)
    finally:
        burner.kill()
        burner.wait()
    assert first == second and len(first) > 0
    assert ends == again and all(e.end <= ends[e.rank] for e in first)  # every clock from 0 again
    recv = [e for e in first if e.rank == 1 and e.kind.value == "recv-wait"][0]
    transfer = [e for e in first if e.rank == 1 and e.kind.value == "transfer"][0]
    prof = __import__("pipelib.costmodel", fromlist=["x"]).PROFILES["toy-gpu"]
    assert transfer.start == pytest.approx(4e6 / prof.flops)  # sent when rank 0 finished work
    assert transfer.duration == pytest.approx(prof.link.time(4000))
    assert recv.start == pytest.approx(3e6 / prof.flops)  # rank 1 idle from the end of its work
    assert recv.end == pytest.approx(transfer.end)  # ... until the bytes arrived


def _oom():
    import torch

    from pipelib.runtime.device import current

    dev = current()
    dev.memory.capacity = 4096
    try:
        x = torch.randn(2048, requires_grad=True)
        with dev.memory.saved_activations():
            x.exp().sum()
    finally:
        dev.memory.capacity = dev.profile.memory


def test_simulated_oom_surfaces_with_rank(cluster4):
    with pytest.raises(RankError, match=r"rank 0 raised SimulatedOutOfMemoryError: rank 0: simulated out of memory"):
        cluster4.run(_oom)


def _collective_then_die(victim):
    import os
    import time

    import torch
    import torch.distributed as dist

    if dist.get_rank() == victim:
        time.sleep(0.3)
        os._exit(1)
    x = torch.ones(1 << 16)
    dist.all_reduce(x)
    return True


def test_killed_engine_mid_collective_names_the_rank_fast():
    with Cluster(3, timeout=5) as c:
        t0 = time.monotonic()
        with pytest.raises(RankDiedError, match=r"rank 2 died while running _collective_then_die") as err:
            c.run(_collective_then_die, 2)
        assert err.value.ranks == [2] and time.monotonic() - t0 < 5
        with pytest.raises(Exception, match="restart"):
            c.run(_raise_on, -1)
        c.restart()
        assert c.run(_raise_on, -1) == [0, 1, 2]
    assert c.client is None


def test_a_stopped_cluster_leaves_the_live_registry(capsys):
    c = Cluster(1, timeout=10, progress=True)  # and says what its start-up is doing
    try:
        assert c in Cluster.live and c.running
        lines = capsys.readouterr().out.splitlines()
        assert [line.split("] ", 1)[1].split(" ", 1)[0] for line in lines] == ["starting", "1", "ready:"], lines
        assert "starting 1 engines (sim, toy-gpu, virtual clock)" in lines[0]
    finally:
        c.stop()
    assert c not in Cluster.live and c.client is None
    c.stop()  # idempotent
    assert c not in Cluster.live


def _wall_padded():
    from pipelib.runtime.device import current

    dev = current()
    dev.reset()
    with dev.compute("padded", duration=0.25):
        pass
    return dev.tracer.events[-1].duration


def test_wall_clock_op_lasts_its_modelled_time_and_two_clusters_coexist(cluster4):
    with Cluster(2, clock="wall", timeout=10) as c:
        assert c.tag != cluster4.tag

        def padded():
            t0 = time.perf_counter()
            durations = c.run(_wall_padded)
            assert time.perf_counter() - t0 >= 0.25  # the notebook waited for the sleep
            return durations

        # never shorter than modelled, on every try; at most 5% longer on the best of a few tries
        # (a busy machine wakes a sleeper late by chance, never early: tests/runtime/sleeps.py)
        best_of(padded, at_least=0.25, at_most=0.25 * 1.05)
        assert cluster4.run(_raise_on, -1) == [0, 1, 2, 3]  # the other cluster is untouched


KERNEL_CODE = """
from pipelib import Cluster
c = Cluster(2, timeout=10)
print("TAG", c.tag, flush=True)
"""


def test_sigkilled_kernel_leaves_no_cluster_process_after_10s():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        out = []
        kc.execute_interactive(KERNEL_CODE, timeout=120,
                               output_hook=lambda m: out.append(m["content"].get("text", "")))
        tag = "".join(out).split("TAG", 1)[1].split()[0]
        from pipelib.runtime.watchdog import tagged_processes
        assert len(tagged_processes(tag)) >= 3  # controller(s) and 2 engines
        px = []
        kc.execute_interactive("%%px --no-stream --group-outputs=engine\nprint('px rank', rank)", timeout=30,
                               output_hook=lambda m: px.append(m["content"].get("text", "")))
        assert "px rank 0" in "".join(px) and "px rank 1" in "".join(px)
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        t0 = time.monotonic()
        while tagged_processes(tag) and time.monotonic() - t0 < 10:
            time.sleep(0.2)
        assert tagged_processes(tag) == [], f"orphans after {time.monotonic() - t0:.1f} s"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
