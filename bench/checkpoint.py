"""pipelib's checkpoint against torch.distributed.checkpoint (DCP): save and load throughput on the
same state, as ratios, with every fsync counted on both sides.

The state is a model-like dict of fp32 tensors (`--mib` in all, `--tensors` of them) saved as
whole pieces by `pipelib.checkpoint.sharded.save_sharded` (temp name, fsync, rename, fsync of
the directory, checksum computed on the way, manifest last) and by DCP's `FileSystemWriter`
(`sync_files=True`, its default: fsync of each data file, then `.metadata` written, fsynced and
renamed).

Loads are compared like for like: each side ends with every tensor's bytes in memory of its
own, as a resume needs them, read from the disk. Before each load the checkpoint's files are
dropped from the page cache (`posix_fadvise(DONTNEED)` on each file, after its fsync: clean
pages go, and only this benchmark's files), so neither side reads what the save left in memory.
DCP's `load` copies into tensors it allocates (`dcp_load_whole`); pipelib's `load_whole` maps
its files (`torch.load(mmap=True)`: tensors that point at the page cache, read lazily), so its
timed load also copies every tensor into a new one, the copy a resume makes into the
parameters. pipelib checks every file's checksum as it reads (CRC-32 by default, SHA-256 on the
second row) and DCP checks none: `pipelib_noverify` is pipelib without the check, the cost of
the checksum. One process, no process group, fresh directories of one file system; the rounds
alternate which side goes first and the medians are compared (on a shared 2-core machine
rounds vary several-fold: the JSON keeps each, and the machine's load average).
Reported: throughput in MiB/s and the ratios pipelib / DCP (target: at least 0.8 on save and
on load).

    .venv/bin/python bench/checkpoint.py [--mib 256] [--tensors 64] [--rounds 5] [--quick]

Writes bench/results/checkpoint.json.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import load, write  # noqa: E402

TARGET = 0.8  # pipelib / DCP throughput, save and load


@contextlib.contextmanager
def counting_fsyncs(counter: list):
    """Count every os.fsync made inside (DCP's and pipelib's alike) into counter[0]."""
    real = os.fsync

    def fsync(fd):
        counter[0] += 1
        return real(fd)

    os.fsync = fsync
    try:
        yield
    finally:
        os.fsync = real


def make_state(mib: int, tensors: int):
    import torch

    g = torch.Generator().manual_seed(0)
    per = mib * (1 << 20) // 4 // tensors
    return {f"model/layer{i}.weight": torch.randn(per, generator=g) for i in range(tensors)}


def _timed(fn, directory):
    count = [0]
    with counting_fsyncs(count):
        t0 = time.perf_counter()
        fn(directory)
        dt = time.perf_counter() - t0
    return dt, count[0]


def evict(directory: str) -> None:
    """Drop this checkpoint's files from the page cache (they are fsynced: their pages are clean)."""
    for base, _, names in os.walk(directory):
        for name in names:
            fd = os.open(os.path.join(base, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def owned(tensors: dict) -> dict:
    """Every tensor's bytes copied into a tensor of its own (a mapped file's pages read)."""
    import torch

    return {k: torch.empty_like(t).copy_(t) for k, t in tensors.items()}


def measure(mib: int = 256, tensors: int = 64, rounds: int = 5) -> dict:
    from pipelib.checkpoint.dcp import dcp_load_whole, dcp_save_whole
    from pipelib.checkpoint.pieces import Piece
    from pipelib.checkpoint.sharded import load_whole, save_sharded

    state = make_state(mib, tensors)
    pieces = {k: (t, Piece(tuple(t.shape))) for k, t in state.items()}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    work = tempfile.mkdtemp(prefix="bench-checkpoint-")
    sides = {
        "pipelib": (lambda d: save_sharded(d, 1, pieces), lambda d: owned(load_whole(d))),
        "pipelib_sha256": (lambda d: save_sharded(d, 1, pieces, algorithm="sha256"), lambda d: owned(load_whole(d))),
        "pipelib_noverify": (lambda d: save_sharded(d, 1, pieces), lambda d: owned(load_whole(d, verify=False))),
        "dcp": (lambda d: dcp_save_whole(state, d), lambda d: dcp_load_whole(d)),
    }
    times = {k: {"save": [], "load": [], "save_fsyncs": [], "load_fsyncs": []} for k in sides}
    try:
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                save, load_ = sides[name]
                d = os.path.join(work, f"{name}-{r}")
                dt, n = _timed(save, d)
                times[name]["save"].append(dt)
                times[name]["save_fsyncs"].append(n)
                evict(d)  # the load reads the disk, not what the save left in the page cache
                dt, n = _timed(load_, d)
                times[name]["load"].append(dt)
                times[name]["load_fsyncs"].append(n)
                shutil.rmtree(d)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: {op: statistics.median(v[op]) for op in ("save", "load")} for k, v in times.items()}
    mibs = {k: {op: nbytes / (1 << 20) / s for op, s in v.items()} for k, v in med.items()}
    ratios = {f"{k}_over_dcp_{op}": mibs[k][op] / mibs["dcp"][op]
              for k in ("pipelib", "pipelib_sha256", "pipelib_noverify") for op in ("save", "load")}
    return {"mib": nbytes / (1 << 20), "tensors": tensors, "rounds": rounds, "median_s": med,
            "mib_per_s": mibs, "fsyncs_per_save": {k: v["save_fsyncs"][0] for k, v in times.items()},
            "times_s": times, "target": TARGET, **ratios}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="32 MiB, 3 rounds")
    a = ap.parse_args(argv)
    t0 = time.time()
    row = measure(32 if a.quick else a.mib, a.tensors, 3 if a.quick else a.rounds)
    out = {"benchmark": "checkpoint", "rows": [row], "seconds": time.time() - t0, "load": load()}
    write("checkpoint", out)
    m = row["mib_per_s"]
    print(f"{row['mib']:.0f} MiB in {row['tensors']} tensors: save pipelib {m['pipelib']['save']:.0f} MiB/s "
          f"(sha256 {m['pipelib_sha256']['save']:.0f}), DCP {m['dcp']['save']:.0f} MiB/s; load pipelib "
          f"{m['pipelib']['load']:.0f} (sha256 {m['pipelib_sha256']['load']:.0f}), DCP {m['dcp']['load']:.0f} MiB/s")
    print(f"ratios pipelib/DCP (target >= {TARGET}): save {row['pipelib_over_dcp_save']:.2f} "
          f"(sha256 {row['pipelib_sha256_over_dcp_save']:.2f}), load {row['pipelib_over_dcp_load']:.2f} "
          f"(sha256 {row['pipelib_sha256_over_dcp_load']:.2f}, no checksum "
          f"{row['pipelib_noverify_over_dcp_load']:.2f}); fsyncs per save {row['fsyncs_per_save']}; "
          f"load average {out['load']}")
    return out


if __name__ == "__main__":
    main()
