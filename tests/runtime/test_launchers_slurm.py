"""`Cluster(2, launcher="slurm")` for real, on a one-node SLURM (Debian's slurm-wlm and munge,
`tools/slurm_localhost.sh start`, which `make test` runs): the engines are one sbatch job whose
srun tasks are the ranks; the job is cancelled on stop. Skipped with the reason where there is
no SLURM; required under CI=true."""
import os
import subprocess

import pytest
import torch

from pipelib.runtime.launchers import LAUNCHERS

pytestmark = pytest.mark.cluster


def _no_slurm() -> str | None:
    return LAUNCHERS["slurm"].unavailable()


@pytest.fixture(scope="module")
def slurm2():
    from pipelib.runtime.cluster import Cluster

    why = _no_slurm()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why + " (CI=true: the SLURM launcher is required)")
        pytest.skip(why)
    c = Cluster(2, device="cpu", launcher="slurm", timeout=60)
    yield c
    c.stop()


def _ranks_and_sum():
    import torch.distributed as dist

    x = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(x)
    return dist.get_rank(), int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]), x.item()


def test_a_slurm_job_is_the_cluster(slurm2):
    assert slurm2.run(_ranks_and_sum) == [(0, 0, 2, 3.0), (1, 1, 2, 3.0)]
    (job,) = slurm2.jobs
    squeue = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %D"], capture_output=True, text=True, timeout=30)
    assert squeue.stdout.split() == ["RUNNING", "1"]         # one job, on the one node
    assert os.path.exists(os.path.join(slurm2._rundir, "slurm_engine.sbatch"))


def test_stop_cancels_the_job():
    from pipelib.runtime.cluster import Cluster

    why = _no_slurm()
    if why:
        pytest.skip(why)
    c = Cluster(2, device="cpu", launcher="slurm", timeout=60)
    (job,) = c.jobs
    c.stop()
    assert c.jobs == []
    squeue = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30)
    assert squeue.stdout.strip() in ("", "COMPLETING", "CANCELLED"), squeue.stdout
