"""Command line: `python -m pipelib check`, `train`, `doctor` and `gpu-check`.

`check` is the bridge to many machines: under torchrun (one process per GPU, any number of
nodes) it initialises torch.distributed from the environment torchrun sets, then runs the same
pipelib code the notebooks run on engines: a traced ping between neighbours and an all-reduce.

    torchrun --nproc-per-node 4 -m pipelib check                      # one machine
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 -m pipelib check               # two nodes, NCCL

`train` runs a recipe under a plan under torchrun, with no cluster (`pipelib.launch`):

    torchrun --standalone --nproc-per-node 4 -m pipelib train --plan plan.json --check
    torchrun --standalone --nproc-per-node 2 -m pipelib train --dp 2 --steps 5 --out run.json

`doctor` prints what this machine offers and starts a 2-engine cluster to prove it works.

`gpu-check` starts the book's cluster on every GPU (NCCL) and runs every collective and strategy
against one process and torch's twins, as one table (`pipelib.gpucheck`); CI runs it on CPUs:

    python -m pipelib gpu-check                                    # every GPU of this machine
    python -m pipelib gpu-check --device cpu --world 2 --json gpu-check.json
"""
from __future__ import annotations

import argparse
import os
import sys


def ping_neighbours(x, y, rank: int, world: int) -> None:
    """Send x to rank + 1 and receive y from rank - 1 as one exchange, traced by pipelib's
    messages. NCCL matches messages by their order between two ranks, not by tag, and runs a
    rank pair's messages in the order they were posted: on 2 ranks (left = right) two sends posted
    before their receives would wait for each other. `sendrecv` posts both as one batch (one NCCL
    group call under NCCL's matching rules, `pipelib.runtime.matching`), with no header
    (check=False: both buffers have the same size by construction)."""
    from pipelib.comm import p2p as comms

    comms.sendrecv(x, (rank + 1) % world, y, (rank - 1) % world, check=False)


def check(device: str) -> int:
    import torch
    import torch.distributed as dist

    from pipelib.runtime.args import real_device_kind
    from pipelib.runtime.device import Device, DeviceSpec, set_current

    if "RANK" not in os.environ:
        print("run me under torchrun: torchrun --nproc-per-node 2 -m pipelib check", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        device = real_device_kind(device, gpus, "pipelib check")
        dev = set_current(Device(rank, world, DeviceSpec(device)))  # on cuda: LOCAL_RANK's GPU (`gpu_of`)
    except ValueError as e:
        print(e if str(e).startswith("pipelib check") else f"pipelib check: {e}", file=sys.stderr)
        return 2
    kw = {"device_id": dev.torch_device} if device == "cuda" else {}  # NCCL told its GPU, not guessing
    dist.init_process_group("nccl" if device == "cuda" else "gloo", **kw)
    try:
        x = torch.full((1 << 20,), float(rank), device=dev.torch_device)
        if world > 1:
            y = torch.empty_like(x)
            ping_neighbours(x, y, rank, world)
            assert y[0].item() == (rank - 1) % world, (rank, y[0].item())
        dist.all_reduce(x)
        assert x[0].item() == sum(range(world))
        waits = [e for e in dev.tracer.events if e.kind.value == "recv-wait"]
        print(f"rank {rank}/{world} on {os.uname().nodename} {dev.torch_device}: ping and all_reduce ok "
              f"({sum(e.duration for e in waits) * 1e3:.2f} ms waiting)", flush=True)
    finally:
        dist.destroy_process_group()
        set_current(None)
    return 0


# what `doctor` looks for beside the launchers: (what, the program, what it enables, how to get it)
TOOLS = (("torchrun", "torchrun", "python -m pipelib train on many processes and nodes", "comes with torch"),)
# the launchers `doctor` reports on: (what, the launcher's name; `pipelib.runtime.launchers` says the rest)
LAUNCHER_LINES = (("MPI", "mpi"), ("SLURM", "slurm"))


def tool_lines() -> list[str]:
    """One line per tool: where it is, what it enables, and how to install it when missing (the
    launchers' own check, `pipelib.runtime.launchers`: Debian's packages, the pip pin)."""
    import shutil

    from pipelib.runtime.launchers import LAUNCHERS

    lines = []
    for what, program, enables, how in TOOLS:
        path = shutil.which(program) or shutil.which(program, path=os.path.dirname(sys.executable))
        lines.append(f"{what}: {path or 'not found'} ({enables}" + (")" if path else f"; to install: {how})"))
    for what, name in LAUNCHER_LINES:
        info, enables = LAUNCHERS[name], f"Cluster(..., launcher={name!r})"
        missing = info.missing()
        lines.append(f"{what}: {info.which()} ({enables})" if not missing else
                     f"{what}: not found: {', '.join(missing)} ({enables}; to install: {info.install})")
    return lines


def _rank_of_engine() -> tuple:
    from pipelib.runtime.device import current

    dev = current()
    return dev.rank, str(dev.torch_device)


def doctor() -> int:
    import torch
    import torch.distributed as dist

    from pipelib.runtime.cluster import Cluster

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"CUDA GPUs: {n}" + "".join(f"\n  {i}: {torch.cuda.get_device_name(i)}" for i in range(n)))
    nccl = dist.is_nccl_available() and n > 0
    print(f"NCCL: yes, one rank per GPU ({n} here)" if nccl else "NCCL: no (gloo on CPUs)")
    print(*tool_lines(), sep="\n")
    with Cluster(2, device="sim") as c:
        ranks = c.run(_rank_of_engine)
        print(f"2-engine simulated cluster ready in {c.startup_seconds:.1f} s: "
              + ", ".join(f"rank {r} on {d}" for r, d in ranks))
    return 0


# flags of `train` that override a field of the plan or the recipe: (flag, type)
TRAIN_FLAGS = (("dp", int), ("tp", int), ("pp", int), ("cp", int), ("data_parallel", str), ("schedule", str),
               ("microbatches", int), ("recompute", str), ("steps", int), ("batch_size", int), ("lr", float),
               ("seed", int), ("optimizer", str))


def train_command(args) -> int:
    from pipelib.launch import load_plan_and_recipe, preflight, train_from_env

    overrides = {name: getattr(args, name) for name, _ in TRAIN_FLAGS}
    if args.sequence_parallel:
        overrides["sequence_parallel"] = True
    try:  # bad input: one line naming the values, before any process group
        recipe, plan = load_plan_and_recipe(args.plan, args.recipe, overrides)
        preflight(recipe, plan, args.device)
    except (RuntimeError, ValueError, TypeError, OSError) as e:
        print(f"pipelib train: {e}" if not str(e).startswith("pipelib train") else str(e), file=sys.stderr)
        return 2
    return train_from_env(recipe, plan, device=args.device, check=args.check, out=args.out,
                          checkpoint=args.checkpoint, save_every=args.save_every, crash_after=args.crash_after)


def gpu_check_command(args) -> int:
    from pipelib.gpucheck.run import gpu_check

    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    return gpu_check(args.device, args.world, args.json, only)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pipelib", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="under torchrun: ping and all_reduce across every rank")
    c.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    t = sub.add_parser("train", help="under torchrun: train a recipe under a plan, one process per device")
    t.add_argument("--plan", help="a Plan as JSON (Plan.to_dict()); default: one rank")
    t.add_argument("--recipe", help="a Recipe as JSON (Recipe.to_dict()); default: the tiny GPT")
    for name, kind in TRAIN_FLAGS:
        t.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    t.add_argument("--sequence-parallel", action="store_true")
    t.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    t.add_argument("--check", action="store_true", help="rank 0 also trains one process and compares")
    t.add_argument("--out", help="rank 0 writes what every rank measured here, as JSON")
    t.add_argument("--checkpoint", help="a directory: save there, resume from its last committed step")
    t.add_argument("--save-every", type=int, default=1, help="steps between checkpoints")
    t.add_argument("--crash-after", type=int, help="the first attempt fails after this step (to see a restart)")
    sub.add_parser("doctor", help="what this machine offers; start a small cluster")
    g = sub.add_parser("gpu-check", help="every collective and strategy on this machine's GPUs (or CPUs), "
                                         "against one process and torch's twins: one table")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    g.add_argument("--world", type=int, default=None, help="ranks (default: every GPU on cuda, 2 on cpu)")
    g.add_argument("--json", help="also write the table's rows here, as JSON")
    g.add_argument("--only", help="comma-separated checks to run (default: all)")
    args = ap.parse_args(argv)
    return {"check": lambda: check(args.device), "train": lambda: train_command(args), "doctor": doctor,
            "gpu-check": lambda: gpu_check_command(args)}[args.cmd]()


if __name__ == "__main__":
    sys.exit(main())
