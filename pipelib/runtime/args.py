"""A cluster's arguments, checked before any process starts.

A typo in a device, profile or clock name, a world size of 0 or more GPUs than the machine has
would otherwise surface seconds later, as an engine failing to start. Here each costs nothing
but a ValueError that names the value given and what to pass instead.

Introduced in chapter 04.
"""
from __future__ import annotations

import math

from pipelib.checks import check_int
from pipelib.runtime.device import DeviceSpec

MAX_WORLD_SIZE = 64  # engines on one machine; more would only wait for the same few cores
DEFAULT_TIMEOUT = 60.0  # seconds for one `Cluster.run` and one torch.distributed operation
MIN_TIMEOUT = 0.5  # below this gloo cannot even connect its ranks (a 1 ms timeout fails in init)


def check_timeout(value, name: str = "timeout", minimum: float = MIN_TIMEOUT) -> float:
    """`value` as a float if it is a finite number of seconds >= `minimum`; else a ValueError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and value > 0 and value >= minimum):
        raise ValueError(f"{name} must be a positive number of seconds (finite, at least {minimum:g}), "
                         f"got {value!r}")
    return float(value)


def validate_args(world_size, device, profile, clock, timeout, track_memory=None) -> DeviceSpec:
    """The `DeviceSpec` every rank will hold, once every argument is checked; else a ValueError
    naming the bad value."""
    check_int(world_size, "world_size", context="Cluster", hint="ranks, one engine each")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(f"Cluster: world_size={world_size}; pass at most {MAX_WORLD_SIZE} "
                         f"(ranks, one engine each, all on this machine)")
    check_timeout(timeout)
    spec = DeviceSpec(device, profile, clock, track_memory)
    if device == "cuda":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < world_size:
            fewer = f"Use world_size <= {have}, or" if have else "Use"
            raise ValueError(
                f"device='cuda' needs one GPU per rank: world_size={world_size} but this machine "
                f"has {have} GPU(s). {fewer} device='sim' to simulate GPUs."
            )
    return spec



def real_device_kind(device: str, gpus: int, what: str) -> str:
    """"cuda" or "cpu" for `device` ("auto", "cpu" or "cuda") on a machine with `gpus` CUDA GPUs;
    a ValueError says what to pass instead. The command line's choice (torchrun's train, gpu-check)."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"{what}: device={device!r}; use 'auto', 'cpu' or 'cuda'")
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    if device == "cuda" and not gpus:
        raise ValueError(f"{what}: --device cuda (NCCL) on a machine without CUDA GPUs; use --device cpu "
                         f"(gloo on CPU processes) or run it on a GPU machine")
    return device
