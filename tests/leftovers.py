"""Which cluster processes this test session started (tests/conftest.py marks the session).

Its own module, not conftest: notebooks/ has a conftest.py too, and `from conftest import ...`
would find whichever was imported last.
"""
import os

SESSION_VAR = "PIPELIB_TEST_SESSION"


def cluster_processes():
    """Pids of the ipyparallel controllers/engines and pipelib watchdogs this session started."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ("ipyparallel.engine" in cmd or "ipyparallel.controller" in cmd or "ipcluster" in cmd
                or "pipelib.runtime.watchdog" in cmd):
            try:
                if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(SESSION_VAR) == os.environ.get(SESSION_VAR):
                    out.append(p.info["pid"])
            except psutil.Error:
                pass
    return out
