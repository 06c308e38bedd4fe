"""Command line: `python -m pipelib check` and `python -m pipelib doctor`.

`check` is the bridge to many machines: under torchrun (one process per GPU, any number of
nodes) it initialises torch.distributed from the environment torchrun sets, then runs the same
pipelib code the notebooks run on engines: a traced ping between neighbours and an all-reduce.

    torchrun --nproc-per-node 4 -m pipelib check                      # one machine
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 -m pipelib check               # two nodes, NCCL

`doctor` prints what this machine offers and starts a 2-engine cluster to prove it works.
"""
from __future__ import annotations

import argparse
import os
import sys


def check(device: str) -> int:
    import torch
    import torch.distributed as dist

    from pipelib.comm import p2p as comms
    from pipelib.runtime.device import Device, DeviceSpec, set_current

    if "RANK" not in os.environ:
        print("run me under torchrun: torchrun --nproc-per-node 2 -m pipelib check", file=sys.stderr)
        return 2
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = set_current(Device(rank, world, DeviceSpec(device)))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    x = torch.full((1 << 20,), float(rank), device=dev.torch_device)
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        h = comms.isend(x, right, label="ping")
        y = comms.recv(torch.empty_like(x), left, label="ping")
        h.wait()
        assert y[0].item() == left, (rank, y[0].item())
    dist.all_reduce(x)
    assert x[0].item() == sum(range(world))
    waits = [e for e in dev.tracer.events if e.kind.value == "recv-wait"]
    print(f"rank {rank}/{world} on {os.uname().nodename} {dev.torch_device}: ping and all_reduce ok "
          f"({sum(e.duration for e in waits) * 1e3:.2f} ms waiting)", flush=True)
    dist.destroy_process_group()
    return 0


def doctor() -> int:
    import torch

    from pipelib.runtime.cluster import Cluster

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"CUDA GPUs: {n}" + "".join(f"\n  {i}: {torch.cuda.get_device_name(i)}" for i in range(n)))
    with Cluster(2, device="sim") as c:
        print(f"2-engine simulated cluster ready in {c.startup_seconds:.1f} s; ranks {c.run(lambda: 1)}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pipelib", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="under torchrun: ping and all_reduce across every rank")
    c.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    sub.add_parser("doctor", help="what this machine offers; start a small cluster")
    args = ap.parse_args(argv)
    return check(args.device) if args.cmd == "check" else doctor()


if __name__ == "__main__":
    sys.exit(main())
