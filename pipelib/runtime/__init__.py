"""pipelib.runtime: the live cluster and what each of its ranks holds.

- `cluster`: `Cluster`, one ipyparallel engine per rank with torch.distributed on each;
- `engine`: what runs on the engines: each rank's start-up and `Cluster.run`'s wrappers;
- `args`: a cluster's arguments, checked before any process starts;
- `progress`: one line per start-up phase while a notebook waits for its cluster;
- `errors`: `RankError`, `RankDiedError`, `RankTimeoutError`: faults as errors naming the rank;
- `registry`: the running clusters of this process, stopped at interpreter exit;
- `watchdog`: kills a cluster's processes when the kernel that owns it is killed;
- `device`: `DeviceSpec` and `Device`, one per rank (`current()`): sim, cpu or cuda;
- `clocks`: the virtual clock (modelled, deterministic) and the wall clock;
- `memtrack`: `MemoryTracker`, bytes by category and saved activations, against a capacity;
- `beacon`: `Activity`, what a rank is doing, readable while it is stuck.

Chapters: the cluster from chapter 04 on (every chapter that runs on ranks); devices and
clocks in chapter 04; the memory tracker in chapters 10-13 (activation memory of each
schedule); the beacon in every error that names what a rank was doing (chapters 05, 06, 12).

The runtime layer (DESIGN.md section 2): torch and process groups. Importing this package
imports nothing; each name below is imported from its module on first use.
"""
from pipelib._lazy import lazy

API: dict[str, str] = {
    "Cluster": "cluster",
    "StartupProgress": "progress",
    "MAX_WORLD_SIZE": "args",
    "DEFAULT_TIMEOUT": "args",
    "validate_args": "args",
    "ClusterError": "errors",
    "RankError": "errors",
    "RankDiedError": "errors",
    "RankTimeoutError": "errors",
    "LiveClusters": "registry",
    "Device": "device",
    "DeviceSpec": "device",
    "DEVICE_KINDS": "device",
    "current": "device",
    "set_current": "device",
    "CLOCKS": "clocks",
    "VirtualClock": "clocks",
    "WallClock": "clocks",
    "MemoryTracker": "memtrack",
    "SimulatedOutOfMemoryError": "memtrack",
    "Activity": "beacon",
}
__all__ = sorted(API)
__getattr__, __dir__ = lazy(__name__, API)
