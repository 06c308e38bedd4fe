"""From-scratch ring all-reduce (pipelib.comm.collectives) vs gloo's built-in dist.all_reduce, and the
alpha-beta model's prediction of it.

Real CPU engines, world 2 and 4, 1 KiB .. 64 MiB. Three variants alternate within every repeat
(same tensor, same moment; the order flips every repeat so a drift in load hits them alike),
each timed between barriers on every rank: ours (the default call: agreement check, then the
pipelined ring), ours without the check, gloo. The time of a repeat is the slowest rank's; we
report medians and the bandwidth ratio gloo time / ours (1.0 = as fast as gloo).

Alpha and beta are fitted twice (relative residuals, `pipelib.comm.lab.fit_alpha_beta`): from a
ring shift (every rank sends to its right neighbour at once, as `pipelib.comm.lab.ring_shift`)
and from chapter 05's ping-pong between ranks 0 and 1 (one message in flight); gamma (seconds
per byte reduced) from torch.add on every rank at once. The ring shifts and the adds are timed
in the same rounds as the race, so fit and race see the same load. The ring's time
2(n-1) alpha + 2(n-1)/n N / beta (+ (n-1)/n N gamma) is set beside the measured medians
("err" = measured / predicted - 1 for the ring without the check; "err ck" for the default
call, whose check is one more message: + alpha). On a machine whose ranks share cores the
ring-shift fit is the one that describes a ring. Writes bench/results/collectives.json, with
the load average before and after.

    .venv/bin/python bench/collectives.py [--quick] [--repeats 15] [--worlds 2,4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VARIANTS = ("ours", "ours_nocheck", "gloo")
FIT_SIZES = [2**k for k in range(0, 25, 2)]  # 1 B .. 16 MiB: the ring's messages are at most 8 MiB


def _bench(sizes, fit_sizes, repeats):
    """On every rank. Each round times, for every size, the three variants (order flipped every
    round), then one ring-shift step and one torch.add per fit size: the fit and the race see the
    same load. Returns {"race": {bytes: {variant: [s]}}, "shift": {bytes: [s]}, "add": {bytes: [s]}}."""
    import time

    import torch
    import torch.distributed as dist

    from pipelib.comm import collectives as C
    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import current

    calls = {"ours": C.all_reduce, "ours_nocheck": lambda y: C.all_reduce(y, check=False),
             "gloo": dist.all_reduce}  # the order of VARIANTS (this runs on engines: no globals)
    names, r, n = tuple(calls), dist.get_rank(), dist.get_world_size()
    xs = {nb: torch.randn(nb // 4) for nb in sizes}
    for x in xs.values():
        a, b = x.clone(), x.clone()
        C.all_reduce(a)  # warm-up, and the results must agree
        dist.all_reduce(b)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-3)
    out = {"race": {nb: {k: [] for k in names} for nb in sizes},
           "shift": {nb: [] for nb in fit_sizes}, "add": {nb: [] for nb in fit_sizes}}

    def timed(fn, *args):
        dist.barrier()
        t0 = time.perf_counter()
        fn(*args)
        return time.perf_counter() - t0

    def shift(src, dst):
        comms.wait_all([comms.irecv(dst, (r - 1) % n, check=False), comms.isend(src, (r + 1) % n, check=False)])

    # buffers made (and touched) once: a fresh receive buffer costs page faults inside the timing
    bufs = {nb: (torch.zeros(nb, dtype=torch.uint8), torch.zeros(nb, dtype=torch.uint8),
                 torch.ones(max(nb // 4, 1)), torch.ones(max(nb // 4, 1))) for nb in fit_sizes}
    for i in range(repeats):
        for nb, x in xs.items():
            for name in (names if i % 2 == 0 else names[::-1]):
                out["race"][nb][name].append(timed(calls[name], x.clone()))
        for nb, (src, dst, u, v) in bufs.items():
            out["shift"][nb].append(timed(shift, src, dst))
            out["add"][nb].append(timed(lambda: torch.add(u, v, out=u)))  # noqa: B023 (called here)
        current().tracer.clear()  # thousands of events are of no use here
    return out


def _slowest(per_rank, key, nb, repeats, variant=None):
    """Per round, the slowest rank's time."""
    pick = (lambda r: r[key][nb][variant]) if variant else (lambda r: r[key][nb])
    return [max(pick(r)[i] for r in per_rank) for i in range(repeats)]


def _fits(cluster, per_rank, fit_sizes, repeats):
    """alpha, beta from the ring shifts of the race and from a ping-pong (ranks 0, 1, chapter
    05's method, run after it), gamma (seconds per byte) from the torch.adds; relative fits."""
    from pipelib.comm import lab
    from pipelib.comm.alphabeta import fit_alpha_beta

    rows = {"ring_shift": [(nb, statistics.median(_slowest(per_rank, "shift", nb, repeats))) for nb in fit_sizes],
            "reduce": [(max(nb // 4, 1) * 4, statistics.median(_slowest(per_rank, "add", nb, repeats)))
                       for nb in fit_sizes],
            "pingpong": [(r["bytes"], r["time"])
                         for r in cluster.run(lab.pingpong, fit_sizes, repeats, timeout=3000)[0]]}
    fits = {}
    for name, pts in rows.items():
        alpha, beta = fit_alpha_beta([p[0] for p in pts], [p[1] for p in pts], relative=True)
        fits[name] = {"alpha_s": alpha, "beta_Bps": beta, "rows": [{"bytes": b, "time": t} for b, t in pts]}
    return fits


def _table(n, sizes, repeats, per_rank, fits):
    from pipelib.comm.alphabeta import predicted_time

    gamma = 1 / fits["reduce"]["beta_Bps"]
    models = {"pingpong": ("pingpong", 0.0), "ring_shift": ("ring_shift", 0.0),
              "ring_shift_gamma": ("ring_shift", gamma)}
    table = []
    for nbytes in sizes:
        med = {k: statistics.median(_slowest(per_rank, "race", nbytes, repeats, k)) for k in VARIANTS}
        bus = 2 * (n - 1) / n * nbytes  # bus bandwidth convention (nccl-tests)
        row = {"bytes": nbytes, **{f"{k}_s": v for k, v in med.items()},
               "ours_busbw": bus / med["ours"], "gloo_busbw": bus / med["gloo"],
               "ratio": med["gloo"] / med["ours"], "ratio_nocheck": med["gloo"] / med["ours_nocheck"],
               "check_cost_s": med["ours"] - med["ours_nocheck"]}
        for model, (fit, g) in models.items():
            a, b = fits[fit]["alpha_s"], fits[fit]["beta_Bps"]
            p = predicted_time("all_reduce", nbytes, n, a, b, g)
            row[f"predicted_{model}_s"] = p
            row[f"error_nocheck_{model}"] = med["ours_nocheck"] / p - 1
            row[f"error_{model}"] = med["ours"] / (p + a) - 1  # the check: one more message
        table.append(row)
    return table


def _print(n, repeats, table, fits):
    print(f"\nworld {n}: ring all-reduce (ours) vs gloo dist.all_reduce, median of {repeats}")
    for fit in ("pingpong", "ring_shift"):
        f = fits[fit]
        print(f"  {fit:10s} fit: alpha {1e6 * f['alpha_s']:8.1f} us, beta {f['beta_Bps'] / 1e9:6.3f} GB/s")
    print(f"  reduction (torch.add): {fits['reduce']['beta_Bps'] / 1e9:.2f} GB/s")
    print(f"{'size':>8} {'ours ms':>9} {'nocheck':>9} {'gloo ms':>9} {'ratio':>6} {'nocheck':>7} {'check ms':>8} "
          f"{'ring+g ms':>9} {'err':>5} {'err ck':>6} {'ring ms':>8} {'err':>5} {'pp ms':>8} {'err':>5}")
    for r in table:
        nb = r["bytes"]
        size = f"{nb // 2**20} MiB" if nb >= 2**20 else f"{nb // 1024} KiB"
        print(f"{size:>8} {1e3 * r['ours_s']:9.3f} {1e3 * r['ours_nocheck_s']:9.3f} {1e3 * r['gloo_s']:9.3f} "
              f"{r['ratio']:6.2f} {r['ratio_nocheck']:7.2f} {1e3 * r['check_cost_s']:8.3f} "
              f"{1e3 * r['predicted_ring_shift_gamma_s']:9.3f} {r['error_nocheck_ring_shift_gamma']:+5.0%} "
              f"{r['error_ring_shift_gamma']:+6.0%} "
              f"{1e3 * r['predicted_ring_shift_s']:8.3f} {r['error_nocheck_ring_shift']:+5.0%} "
              f"{1e3 * r['predicted_pingpong_s']:8.3f} {r['error_nocheck_pingpong']:+5.0%}")


def main(argv=None):
    from pipelib import Cluster

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (CI)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per size (default 15, quick 3)")
    p.add_argument("--worlds", default="2,4", help="world sizes, comma-separated")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "collectives.json"))
    args = p.parse_args(argv)
    top = 22 if args.quick else 26
    sizes = [2**k for k in range(10, top + 1, 2)]
    repeats = args.repeats or (3 if args.quick else 15)
    results = {"sizes": sizes, "repeats": repeats, "cpu_count": os.cpu_count(),
               "load_before": os.getloadavg(), "worlds": {}, "fits": {}}
    for n in [int(w) for w in args.worlds.split(",")]:
        with Cluster(n, device="cpu", timeout=300) as cluster:
            per_rank = cluster.run(_bench, sizes, FIT_SIZES, repeats, timeout=3000)
            fits = _fits(cluster, per_rank, FIT_SIZES, repeats)
        table = _table(n, sizes, repeats, per_rank, fits)
        _print(n, repeats, table, fits)
        results["worlds"][n], results["fits"][n] = table, fits
    results["load_after"] = os.getloadavg()
    print(f"\nload average before {results['load_before'][0]:.1f}, after {results['load_after'][0]:.1f} "
          f"on {os.cpu_count()} cores")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
