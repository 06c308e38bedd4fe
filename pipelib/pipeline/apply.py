"""`apply_pipeline(model, group, schedule, tied_group)`: `parallelize`'s first step.

    pp = apply_pipeline(model, mesh["pp"], schedule, mesh.tied_group(*tied_ranks(schedule)))
    pp.modules                       # this rank's stages (nn.Sequential of the model's own modules)
    loss = pp.run_step(x, y, cross_entropy, done)   # the executor; then the tied weight's sum

The GPT is cut between blocks (`gpt_stages.gpt_stages`) into the schedule's stages, and this
rank keeps the stages the schedule gives its pp index. Its step is the one executor
(`pipelib.pipeline.executor.execute`), which calls `done(module)` as soon as a stage's last
backward is in (torch's REDUCE_GRAD: the other strategies' sums and the data-parallel
reduction run there, once per stage and step), then the tied embedding/head gradient is summed
over the first and last stage's ranks (`gpt_stages.sum_tied_grads`). Chapter 15.
"""
from __future__ import annotations

from pipelib.applied import Applied
from pipelib.pipeline.executor import execute
from pipelib.pipeline.gpt_stages import gpt_stages, sum_tied_grads, tied_ranks
from pipelib.pipeline.schedules import Schedule
from pipelib.pipeline.stage import Stage


def apply_pipeline(model, group, schedule: Schedule, tied_group=None, *, layers=None) -> Applied:
    """Cut `model` (the book's GPT) into `schedule`'s stages and keep this rank's (its index in
    `group`); return what the pipeline leaves on the rank: its stage modules, each parameter's
    stage, its step, and whether this rank computes the loss (it holds the last stage).
    `layers`: the blocks of each stage (uneven stages); None: equal counts."""
    import torch.distributed as dist

    me = dist.get_rank(group)
    cut = gpt_stages(model, schedule.num_stages, "layers" if layers is None else list(layers))
    stages = [Stage(cut[k], k, schedule.num_stages) for k in schedule.stages_of(me)]
    names = {id(p): n for n, p in model.named_parameters()}
    stage_of = {names[id(p)]: st.index for st in reversed(stages) for p in st.module.parameters()}
    held = {st.index: st.module for st in stages}

    def run_step(x, y, loss_fn, done):
        loss = execute(schedule, stages, x, y, loss_fn, group, stage_done=lambda k: done(held[k]))
        sum_tied_grads(model.embed.wte.weight, schedule, group, tied_group)
        return None if loss is None else loss.detach()

    return Applied(axis="pp", placements={n: {"stage": k} for n, k in stage_of.items()},
                   modules=[st.module for st in stages], run_step=run_step,
                   reports_loss=me == tied_ranks(schedule)[1])
