"""The tiny GPT as a pipeline: stages cut between blocks, and the tied embedding/head weight.

    result = gpt_train_step("1f1b", p=4, m=8, gpt_config=GPTConfig(n_layer=8))  # a StepResult per rank

The GPT (`pipelib.model.GPT`, chapter 03) is cut between Transformer blocks: stage 0 runs the
token and position embedding and its blocks, the last stage its blocks, the final LayerNorm and
the language-model head, the stages between only blocks. Blocks are balanced by count, as
Megatron-LM does (Shoeybi et al. 2019; Narayanan et al. 2021).

One weight lives twice. GPT-2 ties the head to the token embedding (Press & Wolf 2017): the
same (V, C) matrix turns token ids into vectors on stage 0 and vectors into logits on the last
stage. On one process autograd sums both uses into one gradient. In a pipeline the rank of stage
0 and the rank of the last stage each hold a copy and each sees only its own use, so after the
step the two gradients must be summed across those two ranks, and both copies receive the sum
(then equal optimizer steps keep the copies equal). Megatron-LM does this with an all-reduce on
its "embedding group" {first rank, last rank}; `gpt_stages.embedding_group` takes that group
from the mesh (`Mesh.tied_group`, at any dp, tp coordinates) and `gpt_stages.sum_tied_grads`
runs it, or, without a group, exchanges the V x C gradient with the peer
(each of the two ranks sends V*C*itemsize bytes and receives as many). When one rank holds both
stages (V schedules) the two uses accumulate into one parameter and nothing is sent.

Balancing by parameters or FLOPs: `gpt_unit_costs` prices the embedding, each block and the
head by parameters or forward FLOPs; balance="params" or "flops" folds the embedding into the
first block and the head into the last, then minimises the most expensive stage. An embedding
has many parameters and almost no FLOPs (a lookup), the tied head few new ones and many FLOPs.

Introduced in chapter 12 (pipelining a real model); the executor is `pipelib.pipeline.step.execute`.
"""
from __future__ import annotations

import torch.distributed as dist

from pipelib.batches import global_batch
from pipelib.checks import check_int
from pipelib.model import GPT, GPTConfig, cross_entropy
from pipelib.pipeline.executor import execute
from pipelib.pipeline.gpt_stages import BALANCE_BY, gpt_stages, sum_tied_grads
from pipelib.pipeline.schedules import Schedule, resolve_schedule
from pipelib.pipeline.stage import Stage, partition
from pipelib.pipeline.step import Runner, StepOptions, check_step, measured_run
from pipelib.results import StepResult
from pipelib.runtime.device import current
from pipelib.runtime.place import to_rank_device

__all__ = ["PIPELINE_GPT", "check_gpt_step", "gpt_train_step", "prepare_gpt_step", "run_gpt_train_step"]

# Eight blocks, so p=4 ranks with v=2 chunks each (8 stages) still get one block per stage.
PIPELINE_GPT = GPTConfig(vocab_size=65, block_size=16, n_layer=8, n_head=2, n_embd=32)


def _check_one_stage_split(s: Schedule) -> None:
    """One stage holding both the embedding and the head cannot split B into I and W:
    `Stage.backward_weight` takes each layer's weight gradient through the whole graph behind
    it, so the head's share of the tied weight would also count the embedding's."""
    if s.num_stages == 1 and any(a.op.value in "IW" for acts in s.actions for a in acts):
        raise ValueError(f"schedule {s.name!r} splits the backward into I and W on a single "
                         f"stage that holds both uses of the tied embedding/head weight; use at "
                         f"least 2 stages or a schedule with full backwards (B)")


def check_gpt_step(schedule, p=None, m=None, gpt_config=None, batch_size=None, *,
                   seq_len: int | None = None, num_chunks: int = 2, balance="layers",
                   world_size: int | None = None) -> Schedule:
    """Every check of a GPT pipeline step that needs no engine (see `pipeline.check_step`)."""
    cfg = gpt_config or PIPELINE_GPT
    if batch_size is not None:
        check_int(batch_size, "batch_size", hint="rows of the global batch")
    s = check_step(schedule, p, m, None, batch_size, num_chunks=num_chunks, world_size=world_size)
    if cfg.n_layer < s.num_stages:
        raise ValueError(f"GPTConfig(n_layer={cfg.n_layer}) has {cfg.n_layer} blocks but schedule "
                         f"{s.name!r} has num_stages={s.num_stages} stages; every stage needs at "
                         f"least one block: use n_layer >= {s.num_stages} or fewer stages")
    partition(cfg.n_layer, s.num_stages, "cost" if balance in BALANCE_BY else balance, [1.0] * cfg.n_layer)
    _check_one_stage_split(s)
    if seq_len is not None and not 1 <= seq_len <= cfg.block_size:
        raise ValueError(f"seq_len={seq_len} must be between 1 and block_size={cfg.block_size}")
    return s


def gpt_train_step(schedule, p: int | None = None, m: int | None = None,
                   gpt_config: GPTConfig | None = None, batch_seed: int = 0, *,
                   seq_len: int | None = None, group=None, emb_group=None, tie: bool = True,
                   prepare=None, **options) -> StepResult | None:
    """Run on every engine: one pipelined forward and backward of the tiny GPT.

    Every rank builds the same GPT (same seed) and batch (`pipelib.batches.global_batch`, default 2 rows per
    microbatch), cuts it with `gpt_stages`, keeps its own stages (each passed through
    `prepare(module)` first when given: chapter 14's recomputation) and calls `execute` with
    next-token cross-entropy on (B, T, V) logits vs (B, T) targets. Then the tied
    embedding/head gradient is summed over the first and last stage's ranks (`sum_tied_grads`;
    tie=False skips it, to show what goes wrong). Returns a `StepResult` (`step.measured_run`):
    the loss (or None), {monolith parameter name: gradient} for this rank's stages, the tied
    weight as "embed.wte.weight" on both of its ranks, execute's stats plus tied_bytes_sent
    (the sum's share of `bytes_sent`). `options` are `step.StepOptions`' (batch_size, costs...).
    """
    cfg, opts = gpt_config or PIPELINE_GPT, StepOptions(**options)
    s = resolve_schedule(schedule, p, m, opts.num_chunks)
    _check_one_stage_split(s)
    rank = dist.get_rank(group)
    if rank < 0 or rank >= s.num_ranks:
        return None

    return measured_run(lambda: prepare_gpt_step(s, cfg, rank, batch_seed, opts, group, seq_len=seq_len,
                                                 emb_group=emb_group, tie=tie, prepare=prepare), 1, group)


def prepare_gpt_step(s: Schedule, cfg: GPTConfig, rank: int, batch_seed: int = 0,
                     opts: StepOptions | None = None, group=None, *, seq_len: int | None = None,
                     emb_group=None, tie: bool = True, prepare=None) -> Runner:
    """`step.prepare_step` for the GPT: the seeded model cut by `gpt_stages`, `rank`'s stages
    (through `prepare`), the token batch; its step is `execute`, then the tied-gradient sum."""
    opts = opts or StepOptions()
    model = to_rank_device(GPT(cfg, seed=opts.model_seed).to(opts.dtype))  # seeded on the CPU, then moved
    mods = gpt_stages(model, s.num_stages, opts.balance)
    mine = [Stage(prepare(mods[k]) if prepare else mods[k], k, s.num_stages) for k in s.stages_of(rank)]
    idx, targets = to_rank_device(global_batch(cfg, opts.rows(s), 0, batch_seed, seq_len=seq_len))  # (B, T)
    held, info = {id(q) for st in mine for q in st.module.parameters()}, {}

    def step():
        loss = execute(s, mine, idx, targets, cross_entropy, group, stats=info, **opts.execute_kw())
        with current().measure() as tied:  # nested in the step's scope: the sum's own bytes
            if tie:
                sum_tied_grads(model.embed.wte.weight, s, group, emb_group)
        info["tied_bytes_sent"] = tied.bytes_sent
        return loss

    def grads():
        return {name: q.grad for name, q in model.named_parameters() if id(q) in held}

    return Runner(step, [st.module for st in mine], grads, info)


def run_gpt_train_step(cluster, schedule, p=None, m=None, gpt_config=None, batch_seed: int = 0,
                       **kw) -> list:
    """Check everything in the notebook process (`check_gpt_step`), then run on every rank."""
    opts, _ = StepOptions.split(kw, gpt_train_step)  # an unknown keyword fails here, as a TypeError
    s = check_gpt_step(schedule, p, m, gpt_config, opts.batch_size, seq_len=kw.get("seq_len"),
                       num_chunks=opts.num_chunks, balance=opts.balance, world_size=cluster.world_size)
    return cluster.run(gpt_train_step, s, None, None, gpt_config, batch_seed, **kw)
