"""Nothing a cluster runs listens beyond loopback (issue 27), and its files are the user's only.

While a 4-engine cluster runs (sim, then cpu inside a real IPython kernel, the notebook's own
process), every listening TCP socket and every bound UDP socket of the notebook process, the
controller, the engines and the watchdog is on 127.0.0.1 or ::1. Sockets are read per process
from /proc/<pid>/net/{tcp,tcp6,udp,udp6} matched with /proc/<pid>/fd (psutil does both).

The audit can fail: `test_the_audit_catches_a_tcp_rendezvous` opens, on one engine, the store
that `init_method="tcp://127.0.0.1:PORT"` (the rendezvous before this issue) builds, and the
audit must report it, on every interface.
"""
import ipaddress
import json
import os
import stat

import psutil
import pytest

from pipelib.runtime.watchdog import tagged_processes

pytestmark = pytest.mark.cluster


def listening(pids) -> list[tuple]:
    """(pid, 'tcp'|'udp', ip, port) of every listening TCP or bound UDP socket of `pids`."""
    import socket

    out = []
    for pid in pids:
        for c in psutil.Process(pid).net_connections(kind="inet"):
            tcp = c.type == socket.SOCK_STREAM
            if c.laddr and (not tcp or c.status == psutil.CONN_LISTEN):
                out.append((pid, "tcp" if tcp else "udp", c.laddr.ip, c.laddr.port))
    return out


def beyond_loopback(sockets) -> list[tuple]:
    def loopback(ip):
        a = ipaddress.ip_address(ip.split("%")[0])
        return a.is_loopback or (getattr(a, "ipv4_mapped", None) or a).is_loopback
    return [s for s in sockets if not loopback(s[2])]


def cluster_processes(tag: str, watchdog_pid: int, notebook_pid: int, world_size: int) -> list[int]:
    tagged = [p.pid for p in tagged_processes(tag)]
    assert len(tagged) >= world_size + 1, f"controller and {world_size} engines expected: {tagged}"
    return [notebook_pid, watchdog_pid, *tagged]


def _allreduce():
    import torch
    import torch.distributed as dist

    x = torch.ones(4)
    dist.all_reduce(x)
    return int(x[0])


def _store_kind():
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return type(store).__name__, getattr(store, "path", None)


def test_sim_cluster_listens_on_loopback_only_and_meets_at_a_file(cluster4):
    assert cluster4.run(_allreduce) == [4] * 4  # gloo's connections made
    pids = cluster_processes(cluster4.tag, cluster4._watchdog.pid, os.getpid(), 4)
    sockets = listening(pids)
    assert {s[0] for s in sockets} >= set(cluster4.pids), f"gloo listens on every engine: {sockets}"
    assert beyond_loopback(sockets) == []
    # no TCP store: the ranks met at a file in the private run directory
    assert {kind for kind, _ in cluster4.run(_store_kind)} == {"FileStore"}


_held = []  # on an engine: the tcp:// store, kept open while the audit looks


def _open_tcp_rendezvous():
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("tcp://127.0.0.1:0?rank=0&world_size=1"))
    _held.append(store)
    return store.port


def _close_tcp_rendezvous():
    _held.clear()


def test_the_audit_catches_a_tcp_rendezvous(cluster4):
    """What init_method="tcp://127.0.0.1:PORT" builds listens on every interface: red."""
    [port] = cluster4.run_on([0], _open_tcp_rendezvous)
    try:
        pids = cluster_processes(cluster4.tag, cluster4._watchdog.pid, os.getpid(), 4)
        caught = beyond_loopback(listening(pids))
        assert (cluster4.pids[0], "tcp", "::", port) in caught or \
            (cluster4.pids[0], "tcp", "0.0.0.0", port) in caught, caught
    finally:
        cluster4.run_on([0], _close_tcp_rendezvous)


KERNEL_CODE = """
import json, os
from pipelib.runtime.cluster import Cluster
c = Cluster(4, device="cpu", timeout=60, progress=False)
ones = c.run(lambda: __import__("torch.distributed").distributed.all_reduce(
    __import__("torch").ones(1)) or 1)
print(json.dumps({"tag": c.tag, "watchdog": c._watchdog.pid, "pids": c.pids, "ones": ones,
                  "kernel": os.getpid()}))
"""


def test_cpu_cluster_in_a_kernel_listens_on_loopback_only():
    """The notebook's own process is a kernel: its sockets are audited with the cluster's."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        out = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))
        kc.execute_interactive(KERNEL_CODE, output_hook=hook, timeout=240)
        info = json.loads("".join(out).strip().splitlines()[-1])
        assert info["ones"] == [1] * 4
        pids = cluster_processes(info["tag"], info["watchdog"], info["kernel"], 4)
        sockets = listening(pids)
        assert {s[0] for s in sockets} >= set(info["pids"]) | {info["kernel"]}, sockets
        assert beyond_loopback(sockets) == []
        kc.execute_interactive("c.stop()", timeout=60)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_run_directory_and_security_files_are_private(cluster4):
    """The run directory is 0700 (what is in it, logs and the rendezvous file included, is out of
    other users' reach), the connection files 0600, nothing is world-writable, and the HMAC key
    is only in the connection files (not in a log, an output, or a command line)."""
    rundir = cluster4._rundir
    assert stat.S_IMODE(os.stat(rundir).st_mode) == 0o700
    keys, files = set(), []
    for root, dirs, names in os.walk(rundir):
        for name in dirs + names:
            path = os.path.join(root, name)
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            assert not mode & stat.S_IWOTH, f"world-writable: {path} {oct(mode)}"
            if name in dirs:
                continue
            files.append(path)
            if name.endswith(".json") and os.path.basename(root) == "security":
                key = json.load(open(path)).get("key")  # the cluster's state file holds none
                if key is not None:
                    assert mode == 0o600, f"{path} {oct(mode)}"
                    keys.add(key)
    assert len(keys) == 1 and all(keys), f"one signing key, in the connection files: {keys}"
    for path in files:
        if os.path.basename(os.path.dirname(path)) != "security" and os.path.isfile(path):
            text = open(path, "rb").read()
            assert not any(k.encode() in text for k in keys), f"key in {path}"
    for p in tagged_processes(cluster4.tag):
        cmd = " ".join(p.cmdline())
        assert not any(k in cmd for k in keys), f"key on the command line of {p.pid}: {cmd}"
