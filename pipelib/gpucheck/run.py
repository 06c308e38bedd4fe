"""`python -m pipelib gpu-check`: start the cluster, run every check in turn, print the table.

    gpu_check("cuda")                         # every GPU of this machine, NCCL; the exit status
    gpu_check("cpu", world=2, json_path="gpu-check.json")    # what CI runs: 2 CPU engines, gloo

The first row is the cluster itself: one engine per device (on GPUs, each rank on a GPU of its
own). Then each check of the registry (`pipelib.gpucheck.registry.CHECKS`, or the names in
`only`) runs with the same `Context`. A check that raises fails its row with the error's first
line; if the engines are no longer in step afterwards (a barrier on every rank does not come
back within `PROBE_S` seconds, or a rank died) the cluster is started afresh before the next
row. The status is 0 when every row passed (a skipped row passes), 1 when one failed, 2 when the
arguments cannot run here (no GPU for ``--device cuda``, more ranks than GPUs, unknown checks).
"""
from __future__ import annotations

import sys
import time

from pipelib.gpucheck.report import Report
from pipelib.gpucheck.rows import Context, Measured, Row, Sizes, backend_of, error_line, judged

PROBE_S = 30.0          # seconds a barrier on every rank may take before the cluster is restarted
RUN_TIMEOUT_S = 90.0    # the cluster's bound on any one run (a hang becomes a row's failure)


def choose(device: str, world: int | None, gpus: int) -> tuple[str, int]:
    """("cuda" or "cpu", ranks) for `device` ("auto", "cuda", "cpu") and `world` (None: every GPU
    on cuda, 2 on cpu) on a machine with `gpus` GPUs; a ValueError says what to pass instead."""
    from pipelib.checks import check_int
    from pipelib.runtime.args import real_device_kind

    device = real_device_kind(device, gpus, "gpu-check")
    world = (gpus if device == "cuda" else 2) if world is None else world
    check_int(world, "--world", context="gpu-check")
    if device == "cuda" and world > gpus:
        raise ValueError(f"gpu-check: --world {world} on {gpus} GPU(s): NCCL needs one GPU per rank; "
                         f"use --world {gpus} or fewer")
    return device, world


def selected(checks, only) -> list:
    """The entries of `checks` to run: all of them, or those named in `only`, in table order."""
    if not only:
        return list(checks.values())
    unknown = [n for n in only if n not in checks]
    if unknown:
        raise ValueError(f"gpu-check: unknown check(s) {unknown}; use some of {list(checks)}")
    return [info for name, info in checks.items() if name in only]


def _rank_device() -> str:
    from pipelib.runtime.device import current

    return str(current().torch_device)


def _in_step() -> None:
    import torch.distributed as dist

    dist.barrier()


def cluster_row(cluster, device: str, devices: list[str]) -> Row:
    """The cluster's row: on GPUs every rank on a device of its own (the difference counts the
    ranks on a shared one), and how long the start took."""
    shared = len(devices) - len(set(devices)) if device == "cuda" else 0
    m = Measured(diff=float(shared), note=f"ready in {cluster.startup_seconds:.1f} s", memory=None)
    return judged(Row("cluster", "cluster", "one engine per device" if device == "cuda" else "one engine per rank",
                      0.0, None, m))


def run_check(info, ctx: Context) -> Row:
    """One check's row: skipped below its rank count, else measured and judged; an error is the
    row's failure, with its first line."""
    t0 = time.perf_counter()
    if ctx.world < info.min_ranks:
        m = Measured(skipped=f"needs {info.min_ranks} ranks, the cluster has {ctx.world}")
        return Row(info.name, info.group, info.against, info.tolerance, info.twin, m)
    try:
        m, failure = info.run(ctx), None
    except Exception as e:  # one row's crash is that row's failure; the table goes on
        m, failure = Measured(), error_line(e)
    row = Row(info.name, info.group, info.against, info.tolerance, info.twin, m, time.perf_counter() - t0, failure)
    return judged(row)


def _keep_in_step(cluster) -> str | None:
    """After a crashed row: the engines answer a barrier, or the cluster starts afresh. None, or
    why it could not be restarted."""
    try:
        cluster.run(_in_step, timeout=PROBE_S)
        return None
    except Exception:
        pass
    try:
        cluster.restart()
        return None
    except Exception as e:
        return f"the cluster could not be restarted after the previous row: {error_line(e)}"


def run_checks(cluster, ctx: Context, infos, say=None) -> list[Row]:
    """Every check of `infos` in turn on `ctx`; `say(line)` after each (progress)."""
    rows, dead = [], None
    for info in infos:
        if dead is not None:
            rows.append(Row(info.name, info.group, info.against, info.tolerance, info.twin, Measured(), 0.0, dead))
            continue
        row = run_check(info, ctx)
        rows.append(row)
        if say is not None:
            say(f"gpu-check: {row.name} {row.status} in {row.seconds:.1f} s"
                + (f": {row.failure}" if row.failure else ""))
        if row.failure is not None and (row.measured.error is not None or row.measured.diff is None):
            dead = _keep_in_step(cluster)
    return rows


def _progress(line: str) -> None:
    """A row done, on stderr: a GPU run takes minutes, and the table comes at the end."""
    print(line, file=sys.stderr, flush=True)


def gpu_check(device: str = "auto", world: int | None = None, json_path: str | None = None, only=None,
              checks=None) -> int:
    """The command (module docstring): print the table, write the JSON, return the exit status.
    `checks`: the registry to run (default `CHECKS`)."""
    import torch

    from pipelib.gpucheck.registry import CHECKS
    from pipelib.runtime.cluster import Cluster

    t0 = time.perf_counter()
    try:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        device, world = choose(device, world, gpus)
        infos = selected(CHECKS if checks is None else checks, only)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    cluster, devices = None, []
    try:
        try:
            cluster = Cluster(world, device=device, timeout=RUN_TIMEOUT_S,
                              track_memory=True if device == "cpu" else None)  # the tracker counts activations
            devices = cluster.run(_rank_device)
            rows = [cluster_row(cluster, device, devices)]
            ctx = Context(cluster, device, world, Sizes.for_device(device))
            rows += run_checks(cluster, ctx, infos, _progress)
        except Exception as e:  # the cluster did not start: one failing row says why
            rows = [Row("cluster", "cluster", "one engine per device", 0.0, None, Measured(), 0.0, error_line(e))]
        report = Report(device, backend_of(device), world, tuple(devices), torch.__version__,
                        tuple(rows), time.perf_counter() - t0)
    finally:
        if cluster is not None:
            cluster.stop()
    print(report.table(), flush=True)
    if json_path:
        report.write_json(json_path)
    return 0 if report.passed else 1
