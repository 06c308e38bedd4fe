"""Kill a cluster's processes when the notebook kernel that owns it disappears.

ipyparallel starts its controller and engines in sessions of their own, so they survive a
kernel killed with SIGKILL (nbval does that after a cell timeout), and atexit cannot run in a
killed process (a normal exit is `pipelib.runtime.registry`'s job). This watchdog is started by
`Cluster.start()` (`launch`) in its own session too; it polls the kernel's pid and, once the
kernel is gone, terminates every process carrying the cluster's tag in its environment, then
removes the cluster's run directory and exits.

    python -m pipelib.runtime.watchdog KERNEL_PID KERNEL_CREATE_TIME TAG RUNDIR
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil

TAG_VAR = "PIPELIB_CLUSTER_ID"


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Every live process whose environment carries PIPELIB_CLUSTER_ID=tag."""
    me = os.getpid()
    found = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(TAG_VAR) == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def terminate(procs: list, grace: float = 2.0) -> None:
    """SIGTERM `procs` (psutil processes), SIGKILL what is left after `grace` seconds."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def sweep(tag: str, grace: float = 2.0) -> int:
    """SIGTERM the tagged processes, SIGKILL what is left after `grace` seconds."""
    procs = tagged_processes(tag)
    terminate(procs, grace)
    return len(procs)


def kernel_alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def launch(tag: str, rundir: str) -> subprocess.Popen:
    """Start the watchdog for the cluster `tag` of this process, in a session of its own (so
    that whatever kills this process's group leaves it running)."""
    me = psutil.Process()
    return subprocess.Popen(
        [sys.executable, "-m", "pipelib.runtime.watchdog", str(me.pid), repr(me.create_time()), tag, rundir],
        start_new_session=True, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def reap(proc: subprocess.Popen, timeout: float = 2.0) -> None:
    """Wait for a watchdog told to stop (the run directory's `stopped` file); kill it if late."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def watch(argv: list[str]) -> int:
    pid, ctime, tag, rundir = int(argv[0]), float(argv[1]), argv[2], argv[3]
    stop_file = os.path.join(rundir, "stopped")
    while True:
        if os.path.exists(stop_file) or not os.path.isdir(rundir):
            return 0  # stopped normally: Cluster.stop() cleaned up
        if not kernel_alive(pid, ctime):
            sweep(tag)
            shutil.rmtree(rundir, ignore_errors=True)
            return 0
        time.sleep(0.25)


if __name__ == "__main__":
    sys.exit(watch(sys.argv[1:]))
