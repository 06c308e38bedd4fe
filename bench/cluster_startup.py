"""Start-up time of pipelib's lean cluster against ipyparallel's default cluster, side by side.

Both end with torch.distributed initialised on every engine (the reference initialises it by
hand), alternating A/B runs so a loaded machine slows both. Prints the ratio of medians, the
median time at which each of pipelib's start-up phases ended (`Cluster.startup_phases`: where a
slower start-up spends its time) and the machine's load, and writes JSON to
bench/results/cluster_startup.json.

    .venv/bin/python bench/cluster_startup.py --world-size 4 --repeats 3
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _results import load, write  # noqa: E402  (bench/, the script's own folder)


def pipelib_cluster(n):
    from pipelib.runtime.cluster import Cluster

    t0 = time.perf_counter()
    c = Cluster(n)
    dt = time.perf_counter() - t0
    phases = dict(c.startup_phases)
    c.stop()
    return dt, phases


def _init(rank, n, port):
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    return rank


def reference_cluster(n):
    import ipyparallel as ipp

    from pipelib.runtime.engine import free_port

    t0 = time.perf_counter()
    c = ipp.Cluster(n=n, profile_dir=tempfile.mkdtemp(prefix="bench-ipp-"), log_level=40)
    c.start_cluster_sync()
    rc = c.connect_client_sync()
    rc.wait_for_engines(n, timeout=120, interactive=False)
    port = free_port()
    ars = [rc[e].apply_async(_init, r, n, port) for r, e in enumerate(sorted(rc.ids))]
    [a.get() for a in ars]
    dt = time.perf_counter() - t0
    rc.close()
    c.stop_cluster_sync()
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ours, ref, phases = [], [], []
    load_before = load()
    for _ in range(args.repeats):
        dt, ph = pipelib_cluster(args.world_size)
        ours.append(dt)
        phases.append(ph)
        ref.append(reference_cluster(args.world_size))
    phase_medians = {name: statistics.median(p[name] for p in phases) for name in phases[0]}
    result = {
        "benchmark": "cluster_startup", "world_size": args.world_size, "repeats": args.repeats,
        "pipelib_s": ours, "ipyparallel_default_s": ref,
        "pipelib_median_s": statistics.median(ours), "reference_median_s": statistics.median(ref),
        "ratio": statistics.median(ours) / statistics.median(ref), "cpu_count": os.cpu_count(),
        "pipelib_phases_median_s": phase_medians, "pipelib_phases_s": phases,
        "load_before": load_before, "load_after": load(),
    }
    path = write("cluster_startup", result)
    print("pipelib's start-up, median end of each phase: "
          + ", ".join(f"{name} {t:.2f} s" for name, t in phase_medians.items()))
    print(f"world_size={args.world_size}: pipelib {result['pipelib_median_s']:.2f} s, ipyparallel default "
          f"{result['reference_median_s']:.2f} s, ratio {result['ratio']:.2f} "
          f"(load {load_before} -> {result['load_after']}) -> {path}")


if __name__ == "__main__":
    main()
