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

Launchers that may put engines on other hosts (``mpi``, ``slurm``: `pipelib.runtime.launchers`)
cannot meet at a file only this host sees. Their ranks meet at a `TCPStore` served by the
notebook's own process (`serve_tcp_store`) on the controller's address, which every engine
already reaches; each engine connects as a client (`TcpMeeting`). It is the unauthenticated
store described above, open while the cluster runs and closed by `Cluster.stop`. The backend's
sockets stay on loopback when that address is a loopback one.

`FileMeeting` and `TcpMeeting` are what `Cluster` sends each engine: where to meet, with
`open(world_size, timeout)` giving the engine its store.

Introduced in chapter 04.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class FileMeeting:
    """Ranks of one host meet at a file (the local launcher)."""

    path: str

    def open(self, world_size: int, timeout: float):
        return local_store(self.path, world_size, timeout)


@dataclass(frozen=True)
class TcpMeeting:
    """Ranks meet at the TCP store the notebook's process serves at host:port (mpi, slurm)."""

    host: str
    port: int

    def open(self, world_size: int, timeout: float):
        """A client of the store (it serves nothing); sockets on loopback if the host is."""
        from datetime import timedelta

        import torch.distributed as dist

        if ipaddress.ip_address(self.host).is_loopback:
            os.environ.update(LOOPBACK_ENV)
        return dist.TCPStore(self.host, self.port, world_size=world_size, is_master=False,
                             timeout=timedelta(seconds=timeout))


def serve_tcp_store(host: str, timeout: float):
    """(the server `TCPStore` on a free port, the `TcpMeeting` engines connect to); the server
    lives as long as the returned store object (`Cluster` holds it until `stop`)."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    return store, TcpMeeting(host, store.port)
