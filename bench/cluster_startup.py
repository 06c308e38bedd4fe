"""Start-up time of pipelib's lean cluster against ipyparallel's default cluster, side by side.

Both end with torch.distributed initialised on every engine (the reference initialises it by
hand), alternating A/B runs so a loaded machine slows both. Prints the ratio of medians and
writes JSON to bench/results/cluster_startup.json.

    .venv/bin/python bench/cluster_startup.py --world-size 4 --repeats 3
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pipelib_cluster(n):
    from pipelib.runtime.cluster import Cluster

    t0 = time.perf_counter()
    c = Cluster(n)
    dt = time.perf_counter() - t0
    c.stop()
    return dt


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
    ours, ref = [], []
    for _ in range(args.repeats):
        ours.append(pipelib_cluster(args.world_size))
        ref.append(reference_cluster(args.world_size))
    result = {
        "benchmark": "cluster_startup", "world_size": args.world_size, "repeats": args.repeats,
        "pipelib_s": ours, "ipyparallel_default_s": ref,
        "pipelib_median_s": statistics.median(ours), "reference_median_s": statistics.median(ref),
        "ratio": statistics.median(ours) / statistics.median(ref), "cpu_count": os.cpu_count(),
    }
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "results", "cluster_startup.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"world_size={args.world_size}: pipelib {result['pipelib_median_s']:.2f} s, ipyparallel default "
          f"{result['reference_median_s']:.2f} s, ratio {result['ratio']:.2f} -> {path}")


if __name__ == "__main__":
    main()
