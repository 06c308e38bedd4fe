"""One collective of chapter 06's registry against its twin, torch's built-in, on every rank.

Every rank draws integer-valued floats in [-8, 8] from its own seed and puts them on its device:
sums of such numbers are exact in fp32 in any order, so pipelib's ring or tree and NCCL's (or
gloo's) own algorithm must agree exactly, and the row's tolerance is 0. Then the two are raced,
one call each in turn (`pipelib.runtime.alternate.alternate_steps`: from a barrier, the slowest
rank's time, after the GPU's queue drained). On a GPU the peak of the CUDA allocator over the
whole check is the rank's memory; the tracker does not see a collective's buffers, so a CPU
run reports none.
"""
from __future__ import annotations

import math
import statistics

from pipelib.gpucheck.rows import Context, Measured, error_line


def collective_on_rank(name: str, numel: int, steps: int, seed: int = 0) -> dict:
    """On every rank of the world: {"diff": max |pipelib's - the twin's| on this rank (0 where
    the collective leaves no defined result, e.g. reduce off its root), "why": what differs,
    "times": {"pipelib": [s], "builtin": [s]}, "peak": allocator bytes or None}."""
    import torch
    import torch.distributed as dist

    from pipelib.comm.registry import collective_info
    from pipelib.runtime.alternate import alternate_steps
    from pipelib.runtime.device import current

    info, dev = collective_info(name), current()
    n, me = dist.get_world_size(), dist.get_rank()
    root, cuda = n - 1, dev.kind == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator().manual_seed(1000 * seed + me)  # on the CPU: the same numbers on any device
    x = torch.randint(-8, 9, (numel,), generator=gen).to(torch.float32).to(dev.torch_device)
    want = info.twin(x.clone(), None, root=root)
    got = info.run(x.clone(), None, root=root)
    diff, why = _difference(got, want) if info.holds_result(me, root) else (0.0, "")
    ours, theirs = x.clone(), x.clone()  # in place, call after call: sums grow, stay exact and finite
    times = alternate_steps({"pipelib": lambda: info.run(ours, None, root=root),
                             "builtin": lambda: info.twin(theirs, None, root=root)}, steps, warmup=1)
    peak = None
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    return {"diff": diff, "why": why, "times": times, "peak": peak}


def _difference(got, want) -> tuple[float, str]:
    """(max |got - want|, what differs): inf with the reason when they are not comparable."""
    if got is None or want is None:
        return (0.0, "") if got is want else (math.inf, f"pipelib returned {type(got).__name__}, "
                                                        f"the built-in {type(want).__name__}")
    if got.shape != want.shape:
        return math.inf, f"shape {tuple(got.shape)} against the built-in's {tuple(want.shape)}"
    if not got.numel():
        return 0.0, ""
    d = (got.double().cpu() - want.double().cpu()).abs().max().item()
    return d, ("values" if d else "")


def check_collective(name: str, ctx: Context) -> Measured:
    """The row of collective `name`: skipped where the registry says it does not run on this
    many ranks (halving-doubling: a power of two), else `collective_on_rank` on every rank."""
    from pipelib.comm.registry import collective_info

    info, n = collective_info(name), ctx.world
    numel = max(ctx.sizes.numel // n, 1) * n  # scatter cuts dim 0 into n equal blocks
    try:
        info.expected_bytes((numel,), 4, n, 0)
    except ValueError as e:
        return Measured(skipped=error_line(e).split(": ", 1)[-1])
    out = ctx.cluster.run(collective_on_rank, name, numel, ctx.sizes.race_steps)
    worst = max(range(n), key=lambda r: out[r]["diff"])
    times = out[0]["times"]
    peaks = tuple(o["peak"] for o in out) if ctx.device == "cuda" else None
    where = f"rank {worst}: {out[worst]['why']}" if out[worst]["why"] else ""
    return Measured(diff=out[worst]["diff"], worst=where, pipelib_s=statistics.median(times["pipelib"]),
                       torch_s=statistics.median(times["builtin"]), memory=peaks)
