"""`Cluster(2, launcher="mpi")` for real: engines started by Debian's mpiexec (Open MPI, mpi4py),
ranks from MPI, torch.distributed meeting at a TCP store, a collective and a DDP training run
equal to one process. Skipped with the reason where mpiexec is missing; required under CI=true
(`make test` installs openmpi-bin)."""
import os

import pytest
import torch

from pipelib.model import GPTConfig
from pipelib.plan import Plan
from pipelib.recipe import Recipe
from pipelib.results import check_against_reference
from pipelib.runtime.launchers import LAUNCHERS

pytestmark = pytest.mark.cluster
RECIPE = Recipe(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16), batch_size=8, steps=3,
                lr=1e-2, dtype=torch.float64)


@pytest.fixture(scope="module")
def mpi2():
    from pipelib.runtime.cluster import Cluster

    missing = LAUNCHERS["mpi"].missing()
    if missing:
        why = f"{' and '.join(missing)} not found: {LAUNCHERS['mpi'].install}"
        if os.environ.get("CI") == "true":
            pytest.fail(why + " (CI=true: the MPI launcher is required)")
        pytest.skip(why)
    c = Cluster(2, device="cpu", launcher="mpi", timeout=60)
    yield c
    c.stop()


def _ranks():
    import torch.distributed as dist
    from mpi4py import MPI

    return dist.get_rank(), MPI.COMM_WORLD.Get_rank(), int(os.environ["OMPI_COMM_WORLD_RANK"]), \
        MPI.COMM_WORLD.Get_size(), dist.get_world_size()


def _all_reduce_and_gather():
    import torch.distributed as dist

    x = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(x)
    pids = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    return x.item(), pids


def test_ranks_are_mpis_ranks(mpi2):
    assert mpi2.run(_ranks) == [(0, 0, 0, 2, 2), (1, 1, 1, 2, 2)]
    assert mpi2._eids == [0, 1]   # ipyparallel's engine ids are the MPI ranks (--mpi), in rank order
    assert "launcher='mpi'" in repr(mpi2) and mpi2.jobs == []


def test_the_ranks_met_at_a_tcp_store_not_a_file(mpi2):
    from pipelib.runtime.rendezvous import store_path

    assert mpi2._store is not None and not os.path.exists(store_path(mpi2._rundir))


def test_a_collective(mpi2):
    got = mpi2.run(_all_reduce_and_gather)
    assert [g[0] for g in got] == [3.0, 3.0]
    assert got[0][1] == got[1][1] == mpi2.pids       # every rank sees every engine's process


def test_ddp_training_equals_one_process(mpi2):
    from pipelib.trainer import run

    results = run(mpi2, RECIPE, Plan(dp=2))
    agreed = check_against_reference(results, RECIPE.reference(), shared=True)
    assert agreed.num_tensors == 2 * len(RECIPE.reference().grads)
    assert len(next(r for r in results if r.losses).losses) == RECIPE.steps
