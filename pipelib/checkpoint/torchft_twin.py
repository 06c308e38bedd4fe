"""torchft beside pipelib's restart: replicas that go on, per step, when one of them is lost.

    run = run_torchft(recipe, replicas=2, lose_after=3, steps=6)    # from the notebook, no cluster
    run.participants      # (2, 2, 2, 1, 1, 1): replicas in each step's quorum
    run.losses            # the mean loss of the replicas that ran each step

pipelib's answer to a rank lost for good is torchrun's elastic restart: every worker stops,
starts again on the machines left, and loads the last checkpoint resharded to the new layout
(`pipelib.checkpoint.resume`); the run then *is* the uninterrupted one (same global batch, same
data order), at the price of the restart, the load and the steps since the last save. torchft
(PyTorch's fault-tolerance library, Meta 2025) goes the other way: each data-parallel replica
group runs alone, a lighthouse forms a quorum of the live replicas before every step (the
manager's `start_quorum`), the gradients are averaged over that step's participants only, and
a replica that joins late is brought up to date from a healthy peer's state (live recovery,
`Manager(load_state_dict=, state_dict=)`). Nothing restarts: the survivor's next step simply
has fewer participants. What that costs is what the data is: each replica still reads its own
shard, so the global batch shrinks with the quorum (the data loader must be resharded to keep
it), and the run is no longer the uninterrupted one.

Here: a `torchft.coordination.LighthouseServer` on 127.0.0.1 (min_replicas=1: a quorum of one
survivor is a quorum), and `replicas` processes, all started with multiprocessing's spawn (no
cluster, no torchrun; their output goes to log files), each a replica group
of one rank: a `TCPStore` of its own, `Manager(pg=ProcessGroupGloo(), hostname="127.0.0.1")`,
torchft's `DistributedDataParallel` and `OptimizerWrapper` around the recipe's model and Adam,
and the recipe's batches (replica r reads rows r of `replicas` of each global batch, as dp rank
r does). Replica `lose` exits after step `lose_after` (`os._exit`: no goodbye to the
lighthouse, its heartbeats just stop). Every replica records, per step, its loss, the quorum's
participants and the step's seconds; the parameters of every replica after step `lose_after`
are compared (they must be identical: the replicas are one data-parallel model). The replicas
build the same seeded model, so `init_sync=False`: with torchft's default, step 0 heals every
replica but one from a peer, and a healing replica's gradients do not count in that step (its
first step then averages one replica's rows only, not the global batch).

Must not hang: every wait has a deadline, every process started is killed if still alive when
the function returns, and the lighthouse is shut down. Introduced in chapter 18.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TorchftRun:
    """What the replicas did: per step (0-based), the participants of its quorum, the mean loss
    of the replicas that ran it, the slowest replica's seconds; whether every replica held the
    same parameters after step `lose_after`, the replica lost and when."""

    participants: tuple[int, ...]
    losses: tuple[float, ...]
    seconds: tuple[float, ...]
    replicas_equal: bool
    lost: int
    lose_after: int
    per_replica: tuple[dict, ...]


def _to_log(log: str) -> None:
    """This process's stdout and stderr (torchft's Rust logs, torch's warnings) into `log`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _lighthouse(address, stop, log: str, min_replicas: int) -> None:
    """The lighthouse in a process of its own (spawned): its address out, then wait for `stop`."""
    _to_log(log)
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=5000,
                              heartbeat_timeout_ms=5000)  # a busy 2-core machine can starve a heartbeat
    address.put(server.address())
    stop.wait()
    server.shutdown()


def _replica(replica: int, replicas: int, lighthouse: str, recipe, steps: int, lose: int, lose_after: int,
             out: str, timeout_s: float, started) -> None:
    """One replica group of one rank (runs in a spawned process)."""
    import datetime

    _to_log(out + ".log")

    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from torchft.optim import OptimizerWrapper

    from pipelib.recipe import loss_of

    torch.set_num_threads(1)
    model = recipe.build()
    opt = recipe.make_optimizer(model.parameters())
    store = dist.TCPStore(host_name="127.0.0.1", port=0, is_master=True, wait_for_workers=False)
    timeout = datetime.timedelta(seconds=timeout_s)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
                      load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["optim"])),
                      state_dict=lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
                      replica_id=f"replica{replica}", store_addr="127.0.0.1", store_port=store.port, rank=0,
                      world_size=1, lighthouse_addr=lighthouse, hostname="127.0.0.1", timeout=timeout,
                      quorum_timeout=timeout, connect_timeout=timeout, init_sync=False)
    started.wait(timeout_s)  # every manager heartbeating: the first quorum waits for all of them
    ddp = DistributedDataParallel(manager, model)
    wrapped = OptimizerWrapper(manager, opt)
    record = {"replica": replica, "steps": [], "losses": [], "participants": [], "seconds": []}

    def save():
        with open(out + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(out + ".tmp", out)

    try:
        while manager.current_step() < steps:
            t0 = time.perf_counter()
            step = manager.current_step()
            wrapped.zero_grad()  # starts the quorum of this step
            x, y = recipe.batch(step, replica % replicas, replicas)
            loss = loss_of(ddp, x, y)  # this replica's rows
            loss.backward()  # gradients averaged over this step's participants (torchft's allreduce)
            wrapped.step()   # stepped only if every participant commits
            record["steps"].append(step)
            record["losses"].append(loss.item())
            record["participants"].append(manager.num_participants())
            record["seconds"].append(time.perf_counter() - t0)
            if manager.current_step() == lose_after:
                torch.save({k: v.clone() for k, v in model.state_dict().items()}, out + ".params.pt")
                save()
                if replica == lose:
                    os._exit(0)  # lost for good: no shutdown, no goodbye; its heartbeats stop
        save()
    finally:
        manager.shutdown(wait=False)


def run_torchft(recipe, *, replicas: int = 2, steps: int = 6, lose: int = 1, lose_after: int = 3,
                timeout_s: float = 30.0, deadline_s: float = 240.0) -> TorchftRun:
    """Start a lighthouse and `replicas` replica processes, lose replica `lose` after step
    `lose_after`, run `steps` steps; what they did (module docstring). Raises `TimeoutError`
    (every process killed) when the run is not done within `deadline_s`."""
    import multiprocessing as mp

    if not 0 <= lose < replicas or not 0 < lose_after < steps:
        raise ValueError(f"run_torchft: lose={lose}, lose_after={lose_after} with replicas={replicas}, "
                         f"steps={steps}; lose one of the replicas (0..{replicas - 1}) after a step in "
                         f"1..{steps - 1}, so that steps run before and after it")
    ctx = mp.get_context("spawn")
    work = tempfile.mkdtemp(prefix="torchft-")
    outs = [os.path.join(work, f"replica{r}.json") for r in range(replicas)]
    address, stop, started = ctx.Queue(), ctx.Event(), ctx.Barrier(replicas)
    house = ctx.Process(target=_lighthouse, args=(address, stop, os.path.join(work, "lighthouse.log"), 1),
                        daemon=True)
    procs = []
    try:
        house.start()
        where = address.get(timeout=deadline_s)
        procs = [ctx.Process(target=_replica, args=(r, replicas, where, recipe, steps, lose, lose_after, outs[r],
                                                    timeout_s, started), daemon=True) for r in range(replicas)]
        for p in procs:
            p.start()
        end = time.monotonic() + deadline_s
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        late = [r for r, p in enumerate(procs) if p.is_alive()]
        if late:
            raise TimeoutError(f"run_torchft: replicas {late} still running after {deadline_s} s; killed "
                               f"(their logs: {work})")
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"run_torchft: replicas exited with {bad} (replica, exit code); logs in {work}")
        records, params = [], []
        for path in outs:
            with open(path) as f:
                records.append(json.load(f))
            params.append(torch.load(path + ".params.pt", weights_only=True))
    finally:
        stop.set()
        house.join(10)
        for p in [*procs, house]:
            if p.is_alive():
                p.kill()
                p.join(5)
    return _summary(records, params, steps, lose, lose_after)


def _summary(records: list[dict], params: list[dict], steps: int, lose: int, lose_after: int) -> TorchftRun:
    participants, losses, seconds = [], [], []
    for step in range(steps):
        ran = [(rec["losses"][i], rec["participants"][i], rec["seconds"][i])
               for rec in records for i, s in enumerate(rec["steps"]) if s == step]
        losses.append(sum(v for v, _, _ in ran) / len(ran) if ran else float("nan"))
        participants.append(max((n for _, n, _ in ran), default=0))
        seconds.append(max((t for _, _, t in ran), default=float("nan")))
    equal = all(p.keys() == params[0].keys() and all(torch.equal(p[k], params[0][k]) for k in p)
                for p in params[1:])
    return TorchftRun(tuple(participants), tuple(losses), tuple(seconds), equal, lose, lose_after,
                      tuple(records))
