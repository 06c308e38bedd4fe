"""ZeRO stages 0-3 around any torch optimizer: shard optimizer state, then gradients, then parameters.

    zero = ZeRO(model, group, stage=3, lr=1e-3, mixed_precision=True)      # torch's Adam
    zero = ZeRO(model, group, 2, optimizer=torch.optim.SGD, lr=0.1, momentum=0.9)
    loss = loss_fn(zero(x), y); loss.backward(); zero.step(); zero.zero_grad()
    sched = torch.optim.lr_scheduler.StepLR(zero.optimizer, 10)            # a real Optimizer

Rajbhandari et al. 2020. Every rank of `group` (n ranks) holds the same model; each unit's
trainable parameters (one per layer: `pipelib.data_parallel.zero_units`) live in one flat
buffer cut into n shards, and rank r's optimizer, built over its shards only, updates shard r
of every unit. Frozen parameters (`requires_grad=False`) stay out of the buffers and the
optimizer, untouched. Who sends what, per step (b bytes per element, psi elements, ring
collectives of `pipelib.comm.collectives`):

- stage 0: all-reduce of every unit's gradients (2 (n-1)/n psi b), the full step on every rank;
- stage 1: the full gradients stay, reduce-scatter gives each rank its averaged shard
  ((n-1)/n psi b), the optimizer updates it, all-gather of the updated parameters ((n-1)/n psi b);
- stage 2: as 1, but each unit's gradients are reduce-scattered during backward, as soon as
  autograd has produced them (post-accumulate-grad hooks), and the full ones are dropped;
- stage 3: as 2, and only the shard of the parameters is kept: a unit's parameters are
  all-gathered just before its module's forward (module pre-hook), freed after it, all-gathered
  again when the gradient of its output arrives in backward (a tensor hook), and freed once its
  gradients are reduce-scattered. 3 (n-1)/n psi b. A weight two layers share (the GPT's head
  reuses its embedding's) lives in the first layer's buffer and is gathered for each use: the
  embedding layer travels once more per step.

After backward, `grad_shards()` gives each parameter's piece of the averaged gradient that
this rank's optimizer reads (FSDP2's sharded gradients); `full_gradients()` and
`full_parameters()` gather whole, parameter-shaped tensors (a check); `state_dict()` is this
rank's shard and its optimizer's state.

`mixed_precision=True`: the model runs in 16-bit (`param_dtype`, bf16 by default: no loss
scaling needed), gradients are 16-bit and are reduced in 16-bit, and the optimizer updates
fp32 master weights (its own shard of them), copied back to 16-bit after every step: with Adam,
K = 12 bytes per parameter of optimizer state, as in the paper (16 bytes in all). Frozen
parameters are cast to 16-bit too, so that the model runs in one dtype. `reduce_dtype=
torch.float32` keeps the gradients in fp32 instead, as bf16 practice does (18 bytes per
parameter): stages 2-3 upcast each unit's gradients before the reduce-scatter (FSDP2's
`MixedPrecisionPolicy(reduce_dtype=torch.float32)`) and accumulate micro-batches into fp32
shards; stages 0-1 add each 16-bit gradient into an fp32 buffer as soon as autograd made it
(Megatron's `main_grad`). A sum of N bf16 gradients rounds to 8 significant bits at every hop
of the ring; in fp32 it does not.

`replicate_group`: HSDP (FSDP2 on a 2-D mesh, MiCS): `group` is the shard group, and each
reduced gradient shard is then averaged over the replicas holding the same shard (rank r of
every shard group), with one all-reduce; parameters and optimizer state are sharded over
`group` only.

Stage 3 options (`pipelib.data_parallel.zero_gather`): `prefetch=True` issues the next
module's all-gather while the current one computes (forward and backward; on a simulated
device on a second lane of the clock); `reshard_after_forward=False` keeps every gathered
unit until its gradients are reduced, so backward gathers nothing: 2 (n-1)/n psi b sent
instead of 3, for the unsharded parameters held between forward and backward.

Memory is measured from the tensors this rank really holds (`memory()`) and accounted on the
device's tracker as differences (`pipelib.data_parallel.zero_memory`), so ZeRO nests inside a
pipeline stage that already tracks its module, and a simulated device raises
`SimulatedOutOfMemoryError` when it overflows; the tests and chapter 08 compare it with
`pipelib.data_parallel.zero_formulas`.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch

from pipelib.comm import collectives as C
from pipelib.comm.agreement import agree
from pipelib.data_parallel.zero_formulas import check_stage
from pipelib.data_parallel.zero_gather import ZeROGather
from pipelib.data_parallel.zero_memory import ZeROMemory
from pipelib.data_parallel.zero_shards import ZeROShards
from pipelib.data_parallel.zero_units import build_units
from pipelib.runtime.device import current


class ZeRO(ZeROGather, ZeROMemory, ZeROShards):
    """Data parallelism with ZeRO stage 0, 1, 2 or 3 and any torch optimizer (default Adam)."""

    def __init__(self, model: torch.nn.Module, group=None, stage: int = 1, *, optimizer=None,
                 mixed_precision: bool = False, param_dtype=torch.bfloat16, reduce_dtype=None,
                 prefetch: bool = False, reshard_after_forward: bool = True, replicate_group=None,
                 units=None, check: bool = True,
                 adamw: bool = False, **optimizer_kwargs):
        import torch.distributed as dist

        from pipelib.data_parallel.replicas import check_same_parameters

        self.stage = check_stage(stage)
        make_optimizer, optimizer_kwargs = _zero_optimizer(optimizer, adamw, optimizer_kwargs)
        if mixed_precision and param_dtype != torch.bfloat16:
            raise ValueError(f"ZeRO: param_dtype={param_dtype}; mixed precision here keeps bf16 parameters "
                             f"(torch.bfloat16). fp16 would also need loss scaling (small gradients "
                             f"underflow), which this class does not do")
        wrong = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad and p.dtype != torch.float32})
        if wrong:
            raise ValueError(f"ZeRO: trainable parameters in {', '.join(wrong)}; its flat buffers and master "
                             f"weights are fp32 (bf16 compute with mixed_precision=True), so a "
                             f"{wrong[0].replace('torch.', '')} model would be trained in fp32 without a word. "
                             f"Pass the model in torch.float32 (model.float())")
        self.dtype = param_dtype if mixed_precision else torch.float32
        self.grad_dtype = _grad_dtype(reduce_dtype, self.dtype)
        if (prefetch or not reshard_after_forward) and self.stage != 3:
            raise ValueError(f"ZeRO: prefetch={prefetch}, reshard_after_forward={reshard_after_forward} "
                             f"with stage={self.stage}; both concern gathering parameters, which only "
                             f"stage 3 does. Use stage=3, or leave them at their defaults")
        self.group, self.n, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        if self.rank < 0:
            raise ValueError(f"rank {dist.get_rank()}: ZeRO on a group this rank is not part of")
        self.replicate = replicate_group
        agree("ZeRO", group, stage=self.stage, mixed_precision=self.dtype, grad_dtype=self.grad_dtype,  # one message
              prefetch=prefetch, reshard_after_forward=reshard_after_forward, replicated=replicate_group is not None)
        if check:
            check_same_parameters(model, group)
            if replicate_group is not None:
                check_same_parameters(model, replicate_group)
        self.model, self.mixed = model, bool(mixed_precision)
        self.dev = current()
        self._start_accounting(model)  # the full parameters it replaces, if the device tracked them
        self.units, self.uses = build_units(model, self.n, self.rank, self.dtype, units)
        if not self.units:
            raise ValueError("ZeRO: the model has no trainable parameter (every requires_grad is False)")
        if self.mixed:
            for p in model.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(self.dtype)  # frozen: not trained, but run in the model's dtype
        for u in self.units:
            if self.stage <= 1:  # full gradients in one flat buffer per unit
                u.gflat = torch.zeros(u.padded, dtype=self.grad_dtype, device=u.flat.device)
                for (o, k), (_, p) in zip(u.offsets, u.params):
                    if self.grad_dtype == self.dtype:
                        p.grad = u.gflat[o:o + k].view(p.shape)  # autograd accumulates into the buffer
                    else:  # fp32 main gradients: each 16-bit gradient added in, then dropped
                        p.register_post_accumulate_grad_hook(self._to_main_grad)
            else:
                u.gshard = torch.zeros(u.shard, dtype=self.grad_dtype, device=u.flat.device)
                for _, p in u.params:
                    p.register_post_accumulate_grad_hook(self._grad_ready)
            if self.stage == 3:
                u.mine = u.local().clone()  # the only copy kept between uses
            if self.mixed:
                u.master = u.init32[u.lo:u.hi].clone() if self.stage else u.init32
            else:
                u.master = u.mine if self.stage == 3 else (u.flat if self.stage == 0 else u.local())
            u.init32 = None
        self._unit_of = {id(p): u for u in self.units for _, p in u.params}
        self._offset_of = {id(p): ok for u in self.units for ok, (_, p) in zip(u.offsets, u.params)}
        self._reduced = False  # the averaged gradients are in u.master.grad (until the step)
        # the optimizer sees this rank's shards only: its state is sharded with them
        self.optimizer = make_optimizer([u.master for u in self.units], **optimizer_kwargs)
        self._setup_gather(prefetch, reshard_after_forward)
        if self.stage == 3:
            for mod in self.uses:
                mod.register_forward_pre_hook(self._pre_forward)
                mod.register_forward_hook(self._post_forward)
            for u in self.units:
                self._free(u)
        self.sync_memory()

    # ------------------------------------------------------------------ running the model
    def __call__(self, *args, **kwargs):
        if self.mixed:
            args = [a.to(self.dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
        out = self.model(*args, **kwargs)
        self._forward_done()
        return out

    def _to_main_grad(self, p) -> None:
        """Stages 0-1 with fp32 gradients: add the 16-bit gradient into the fp32 buffer (Megatron's
        `main_grad`: micro-batches accumulate in fp32 too), then drop it."""
        nbytes = p.grad.numel() * p.grad.element_size()
        self._account("gradients", nbytes, "gradient")
        o, k = self._offset_of[id(p)]
        self._unit_of[id(p)].gflat[o:o + k].add_(p.grad.reshape(-1))
        p.grad = None
        self._account("gradients", -nbytes)

    def _grad_ready(self, p) -> None:
        self._account("gradients", p.grad.numel() * p.grad.element_size(), "gradient")
        u = self._unit_of[id(p)]
        u.pending -= 1
        if u.pending == 0:
            self._reduce_unit(u)

    def _reduce_unit(self, u) -> None:
        """Stages 2-3: reduce-scatter one unit's gradients (in `grad_dtype`: fp32 upcasts them
        first) into this rank's shard, drop them, and (stage 3) free the unit."""
        self._lap()
        self._link_free()
        flat = u.flat_grads(self.grad_dtype)
        self._comm(flat.numel() * flat.element_size())
        self._account("gradients", -sum(p.grad.numel() * p.grad.element_size()
                                        for _, p in u.params if p.grad is not None))
        for _, p in u.params:
            p.grad = None
        u.gshard.add_(self._across_replicas(C.reduce_scatter(flat, op="avg", group=self.group)))
        self._comm(-flat.numel() * flat.element_size())
        u.pending = len(u.params)
        if self.stage == 3:
            self._free(u)
        self._resume()

    def _across_replicas(self, t):
        """HSDP: the group's averaged gradient (shard) averaged over the replicas too (FSDP2's
        `(Replicate(), Shard(0))` mesh): an all-reduce of 2 (R-1)/R of the shard's bytes."""
        return t if self.replicate is None else C.all_reduce(t, op="avg", group=self.replicate)

    # ------------------------------------------------------------------ the optimizer step
    def reduce_gradients(self) -> None:
        """Average the gradients over the group into what this rank's optimizer reads
        (`u.master.grad`): the stage's collective (stage 0 all-reduce, stage 1 reduce-scatter;
        stages 2-3 reduced them during backward, only a unit still waiting for a gradient is
        reduced here). Once per step: `step` calls it, and so does `grad_shards`."""
        if self._reduced:
            return
        grads = []
        for u in self.units:
            if self.stage >= 2 and u.pending != len(u.params):  # a parameter got no gradient
                self._reduce_unit(u)
            if self.stage == 0:
                grads.append(self._across_replicas(C.all_reduce(u.gflat, op="avg", group=self.group)))
            elif self.stage == 1:  # the shard's averaged gradient: counted with the gradients
                grads.append(self._across_replicas(C.reduce_scatter(u.gflat, op="avg", group=self.group)))
            else:
                grads.append(u.gshard)
        for u, g in zip(self.units, grads):
            u.master.grad = g.float() if self.mixed else g
        self._reduced = True
        self.sync_memory()  # the gradients handed to the optimizer (fp32 copies in mixed precision)

    def step(self) -> None:
        """Average the gradients (the stage's collective), one optimizer step on this rank's
        shard, and bring every rank's parameters up to date."""
        self.reduce_gradients()
        self.update()
        self.publish()

    def update(self) -> None:
        """The optimizer step on this rank's shards (after `reduce_gradients`): it reads and
        writes psi / N elements per rank from stage 1 on, psi at stage 0."""
        self.reduce_gradients()
        self.optimizer.step()
        self.sync_memory()  # the optimizer's state appears at its first step: an out-of-memory shows here
        for u in self.units:
            u.master.grad = None
        self._reduced = False

    def publish(self) -> None:
        """Bring the parameters the model runs up to date (after `update`)."""
        self._publish()
        self.sync_memory()

    @property
    def updated_numel(self) -> int:
        """Elements this rank's optimizer updates (padded): psi at stage 0, psi / N from stage 1."""
        return sum(u.master.numel() for u in self.units)

    @torch.no_grad()
    def _publish(self) -> None:
        """The updated shards into the parameters the model runs: the 16-bit copy of the
        master weights, and (stages 1-2) the all-gather of every unit's shards."""
        for u in self.units:
            if self.mixed:
                (u.flat if self.stage == 0 else u.mine if self.stage == 3 else u.local()).copy_(u.master)
            if self.stage in (1, 2):
                self._comm(u.nbytes)
                u.flat.copy_(C.all_gather(u.local(), group=self.group))
                self._comm(-u.nbytes)

    def zero_grad(self) -> None:
        for u in self.units:
            (u.gflat if self.stage <= 1 else u.gshard).zero_()


def _grad_dtype(reduce_dtype, dtype):
    """The gradients' dtype: the parameters' (None), or torch.float32 (fp32 gradients under
    bf16 parameters: FSDP2's reduce_dtype, Megatron's main_grad)."""
    if reduce_dtype is None or reduce_dtype == dtype:
        return dtype
    if reduce_dtype != torch.float32:
        raise ValueError(f"ZeRO: reduce_dtype={reduce_dtype}; use None (the parameters' {dtype}) or "
                         f"torch.float32 (gradients upcast and reduced in fp32)")
    return torch.float32


def _zero_optimizer(optimizer, adamw: bool, kwargs: dict):
    """(the optimizer class, its keyword arguments): torch's Adam (AdamW with adamw=True, weight
    decay 0 unless given) and lr=1e-3 by default, else any torch.optim.Optimizer class."""
    if optimizer is None:
        optimizer = torch.optim.AdamW if adamw else torch.optim.Adam
        kwargs = {"lr": 1e-3, **({"weight_decay": 0.0} if adamw else {}), **kwargs}
    elif adamw:
        raise ValueError(f"ZeRO: adamw=True with optimizer={optimizer!r}; pass one of them "
                         f"(optimizer=torch.optim.AdamW)")
    if isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer):
        raise TypeError(f"ZeRO: optimizer={optimizer!r}; pass the optimizer's class (or a function of "
                        f"(params, **kwargs)) and its arguments, e.g. optimizer=torch.optim.SGD, lr=0.1: "
                        f"ZeRO builds it over this rank's shards, so that its state is sharded too")
    return optimizer, kwargs
