"""Mixture-of-experts dispatch and combine: pipelib's uneven all-to-all (point-to-point messages,
`pipelib.comm.uneven`) against gloo's `all_to_all_single` with split sizes, as a throughput ratio.

Real CPU engines (`Cluster(device="cpu")`), world 2 and 4. For each size (bytes each rank
dispatches, 64 KiB .. 16 MiB; rows of 1 KiB, 256 fp32 values, a token of C = 256), every rank
splits its rows unevenly over the ranks (a seeded split, zero runs included, as a router's
counts are; "moved" is the most any rank sends to the others, the rest it keeps), the counts
known to both sides (exchanged once beforehand, as the MoE layer does).
One round times, between barriers on every rank, a dispatch then the combine that brings the
rows back (the reverse splits), for each variant in turn (the order flipping each round so a
drift in load hits both alike): "ours" (the registry's `all_to_all_uneven` as the MoE layer
calls it: counts given, unchecked), "gloo" (`all_to_all_single`, the twin) and "p2p" (the
same pairwise exchange in plain torch.distributed isend/irecv, no pipelib: the floor pipelib's
own bookkeeping, its trace and handles, stands on). A second pass pairs "ours_checked" (the
default call: the ranks agree on dtype, shape and counts first, two more message rounds) with
gloo alike. Apart, since interleaved its rounds disturbed the others': on 2 ranks at 1 MiB,
ours' rounds with a 3-4 ms scheduling stall went from 10 % to 21-31 % and p2p's from 16-18 %
to 21-38 %, gloo's staying at 8 %. A round's
time is the slowest rank's. Reported: medians, and the ratio gloo time / ours (1.0: as fast as
gloo; above 1.0: faster), the median of the per-round ratios (paired). Issue 23's target:
0.9 or more at 1 MiB per rank and above.

Wall-clock numbers on a shared 2-core machine are noisy: read the ratios and the load printed.
Single runs of 61 rounds move by +-0.1; a 2-core VM with 2 or 4 ranks and gloo's threads on them
stalls 3-4 ms in 10-50 % of rounds, every variant. Two runs of 201 rounds there (2026-11-27,
`--spawn --repeats 201`), ratio at 1 / 4 / 16 MiB: 2 ranks 0.94 / 1.02 / 0.88 and 0.90 / 0.93 /
0.96 (plain p2p 1.11 / 1.19 / 0.93 and 1.14 / 1.25 / 0.97), 4 ranks 0.94 / 0.89 / 0.98 and
0.90 / 0.91 / 0.94 (p2p 1.01 / 0.98 / 1.03 and 0.94 / 0.91 / 0.93).
`--spawn` runs the ranks as spawned gloo processes instead of a cluster's engines (no
ipyparallel: a bare machine with torch, e.g. an idle many-core one). Writes
bench/results/expert_parallel.json.

    .venv/bin/python bench/expert_parallel.py [--quick] [--worlds 2,4] [--repeats 9] [--spawn]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import load, write  # noqa: E402

ROW = 1024  # bytes per token row: 256 fp32
PASSES = (("ours", "gloo", "p2p"), ("ours_checked", "gloo"))  # each paired round by round; checked apart


def _race(sizes, repeats, seed, row, passes):
    """On every rank: {bytes: {"moved": bytes, "passes": [{variant: [seconds per round]} per pass]}},
    a dispatch + combine each (no globals: this runs on the engines)."""
    import time

    import torch
    import torch.distributed as dist

    from pipelib.comm.registry import collective_info
    from pipelib.runtime.device import current

    info = collective_info("all_to_all_uneven")
    n, r = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(1)

    def splits(rows, s):  # an uneven split of `rows` over n ranks, one matrix for every rank
        g = torch.Generator().manual_seed(seed + s)
        w = torch.rand(n, n, generator=g) * (torch.rand(n, n, generator=g) > 0.2)
        w[:, 0] += 1e-3  # never all zero
        m = (w / w.sum(1, keepdim=True) * rows).floor().long()
        m[:, -1] += rows - m.sum(1)
        return m

    def p2p(x, ins, outs):  # the same exchange in plain torch.distributed: step s sends to r+s, then
        xs, y = x.split_with_sizes(ins), x.new_empty((sum(outs), *x.shape[1:]))  # receives from r-s;
        ys = y.split_with_sizes(outs)  # own rows copied in flight
        works = []
        for s in range(1, n):
            dst, src = (r + s) % n, (r - s) % n
            works += [dist.isend(xs[dst], dst)] if ins[dst] else []
            works += [dist.irecv(ys[src], src)] if outs[src] else []
        ys[r].copy_(xs[r])
        for w in works:
            w.wait()
        return y

    def run(name, x, ins, outs):
        if name == "p2p":
            return p2p(p2p(x, ins, outs), outs, ins)
        if name == "gloo":
            y = info.twin(x, None, input_splits=ins, output_splits=outs)
            return info.twin(y, None, input_splits=outs, output_splits=ins)
        check = name == "ours_checked"
        y = info.run(x, None, input_splits=ins, output_splits=outs, check=check)
        return info.run(y, None, input_splits=outs, output_splits=ins, check=check)

    out = {}
    for s, nb in enumerate(sizes):
        m = splits(nb // row, s)
        ins, outs = m[r].tolist(), m[:, r].tolist()
        x = torch.randn(nb // row, row // 4)
        out[nb] = {"moved": (sum(ins) - ins[r]) * row, "passes": []}  # bytes this rank's dispatch sends to others
        for variants in passes:
            for name in variants:  # warm-up, and every variant brings the rows back unchanged
                assert torch.equal(run(name, x, ins, outs), x), name
            times = {k: [] for k in variants}
            for i in range(repeats):
                for name in (variants if i % 2 == 0 else variants[::-1]):
                    dist.barrier()
                    t0 = time.perf_counter()
                    run(name, x, ins, outs)
                    times[name].append(time.perf_counter() - t0)
                current().tracer.clear()
            out[nb]["passes"].append(times)
    return out


def _spawned(rank, n, port, args, path):
    """One spawned rank: join a gloo group, race on a plain CPU device, rank 0 saves all ranks'."""
    import pickle

    import torch.distributed as dist

    from pipelib.runtime.device import Device, DeviceSpec, set_current

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    set_current(Device(rank, n, DeviceSpec(kind="cpu")))
    got = [None] * n
    dist.all_gather_object(got, _race(*args))
    if rank == 0:
        with open(path, "wb") as f:
            pickle.dump(got, f)
    dist.destroy_process_group()


def _per_rank(n, args, spawn: bool):
    """{bytes: {variant: [seconds]}} of each rank: on a cluster's CPU engines, or spawned."""
    if not spawn:
        from pipelib import Cluster

        with Cluster(n, device="cpu", timeout=600) as cluster:
            return cluster.run(_race, *args, timeout=3000)
    import pickle
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock, tempfile.TemporaryDirectory() as tmp:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        mp.spawn(_spawned, args=(n, port, args, os.path.join(tmp, "out.pkl")), nprocs=n)
        with open(os.path.join(tmp, "out.pkl"), "rb") as f:
            return pickle.load(f)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, 3 rounds (a smoke run)")
    ap.add_argument("--spawn", action="store_true", help="spawned gloo ranks instead of a cluster")
    a = ap.parse_args(argv)
    top = 22 if a.quick else 24
    sizes = [2**k for k in range(16, top + 1, 2)]
    repeats = 3 if a.quick else a.repeats
    out = {"row_bytes": ROW, "sizes": sizes, "repeats": repeats, "cores": os.cpu_count(), "load_before": load(),
           "spawned": a.spawn, "worlds": {}}
    for n in [int(w) for w in a.worlds.split(",")]:
        per_rank = _per_rank(n, (sizes, repeats, 23, ROW, PASSES), a.spawn)
        rows = []
        print(f"\nworld {n}: dispatch + combine, {repeats} rounds; ratio = gloo time / ours (1.0: as fast)")
        print(f"{'bytes/rank':>10} {'moved':>9} {'ours ms':>8} {'gloo ms':>8} {'p2p ms':>7} {'ratio':>6} {'p2p':>5} "
              f"{'checked ms':>11} {'ratio':>6}")
        for nb in sizes:
            main, checked = ({k: [max(p[nb]["passes"][j][k][i] for p in per_rank) for i in range(repeats)]
                              for k in PASSES[j]} for j in range(2))  # a round's time: its slowest rank's

            def ratio(times, k):
                return statistics.median(g / o for g, o in zip(times["gloo"], times[k]))

            med = {k: statistics.median(v) for k, v in main.items()}
            med_ck = {k: statistics.median(v) for k, v in checked.items()}
            moved = max(p[nb]["moved"] for p in per_rank)
            rows.append({"bytes": nb, "moved_max": moved, **{f"{k}_s": v for k, v in med.items()},
                         "ratio": ratio(main, "ours"), "ratio_p2p": ratio(main, "p2p"),
                         "ours_checked_s": med_ck["ours_checked"], "gloo_checked_pass_s": med_ck["gloo"],
                         "ratio_checked": ratio(checked, "ours_checked")})
            size = f"{nb // 2**20} MiB" if nb >= 2**20 else f"{nb // 1024} KiB"
            print(f"{size:>10} {moved / 1024:6.0f} KiB {1e3 * med['ours']:8.2f} {1e3 * med['gloo']:8.2f} "
                  f"{1e3 * med['p2p']:7.2f} {rows[-1]['ratio']:6.2f} {rows[-1]['ratio_p2p']:5.2f} "
                  f"{1e3 * med_ck['ours_checked']:11.2f} {rows[-1]['ratio_checked']:6.2f}")
        out["worlds"][n] = {"rows": rows, "load_after": load()}
    print(f"\nload average before {out['load_before']}, after {load()} on {os.cpu_count()} cores")
    print(f"wrote {write('expert_parallel', out)}")
    return out


if __name__ == "__main__":
    main()
