"""How a local cluster's ranks meet, with nothing another host can reach.

torch.distributed needs a store, a key-value table where the ranks meet (who is there, which
address each listens on), then the backend's own connections between ranks. For a cluster on
one machine (every `Cluster`: sim, cpu and cuda engines):

- the store is a `FileStore`: one file in the cluster's run directory (mode 0700, the user's
  only), and no socket at all. A `TCPStore` (what `init_method="tcp://..."`, `env://` and
  torchrun's c10d rendezvous build) listens on every interface ('::') whatever address it is
  given, and has no authentication: whoever reaches its port can read and write rendezvous keys,
  and hang or break every collective;
- gloo's and NCCL's sockets are on the loopback interface (`LOOPBACK_ENV`: in the engines'
  environment from their start, and set again just before the process group is made).

A run over several nodes must open ports to the other nodes: README.md, "Networking".

Introduced in chapter 04.
"""
from __future__ import annotations

import os
from types import MappingProxyType

# gloo binds its listening socket to this interface's address (else to the host name's, often
# a public one); NCCL's bootstrap and socket transport likewise
LOOPBACK_ENV = MappingProxyType({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"})
STORE_FILE = "rendezvous"


def store_path(rundir: str) -> str:
    """Where a cluster's ranks meet: a file in its private run directory."""
    return os.path.join(rundir, STORE_FILE)


def local_store(path: str, world_size: int, timeout: float):
    """The store of one rank of a local cluster: a `FileStore` at `path` (no socket), whose waits
    give up after `timeout` seconds; the backend's sockets on loopback from here on."""
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(LOOPBACK_ENV)
    store = dist.FileStore(path, world_size)
    store.set_timeout(timedelta(seconds=timeout))
    return store
