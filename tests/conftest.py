import os
import sys
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every process this test session starts (kernels, engines, book builds) inherits this mark, so
# the leftover check below sees only our own processes, not those of another run on the machine.
SESSION_VAR = "PIPELIB_TEST_SESSION"
os.environ[SESSION_VAR] = SESSION = uuid.uuid4().hex


@pytest.fixture(scope="session")
def cluster4():
    """One 4-engine simulated cluster shared by the cluster tests (start-up costs seconds)."""
    from pipelib.cluster import Cluster

    c = Cluster(4, timeout=8)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def one_thread():
    """Two OpenMP threads on two shared cores are up to 5x slower than one for small models."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cluster_processes():
    """Pids of the ipyparallel controllers/engines and pipelib watchdogs this session started."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("ipyparallel.engine" in cmd or "ipyparallel.controller" in cmd or "ipcluster" in cmd
                or "pipelib._watchdog" in cmd):
            try:
                if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(SESSION_VAR) == SESSION:
                    out.append(p.info["pid"])
            except psutil.Error:
                pass
    return out


def pytest_sessionfinish(session, exitstatus):
    """The last check of every run: no controller, engine or watchdog is left (within 10 s)."""
    import time

    deadline = time.monotonic() + 10
    left = cluster_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = cluster_processes()
    if left:
        sys.stderr.write(f"\nFAILED: cluster processes left behind after the tests: {left}\n")
        session.exitstatus = 1
    else:
        sys.stderr.write("\nno cluster process left behind\n")
