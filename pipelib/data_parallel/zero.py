"""ZeRO stages 0-3 around a real Adam: shard optimizer state, then gradients, then parameters.

    zero = ZeRO(model, group, stage=3, lr=1e-3, mixed_precision=True)
    loss = loss_fn(zero(x), y); loss.backward(); zero.step(); zero.zero_grad()

Rajbhandari et al. 2020. Every rank of `group` (n ranks) holds the same model; each layer's
parameters live in one flat buffer cut into n shards (`pipelib.data_parallel.zero_units`), and
rank r's `torch.optim.Adam` updates only shard r of every layer. Who sends what, per step (b
bytes per element, psi elements, ring collectives of `pipelib.comm.collectives`):

- stage 0: all-reduce of every layer's gradients (2 (n-1)/n psi b), full Adam on every rank;
- stage 1: the full gradients stay, reduce-scatter gives each rank its averaged shard
  ((n-1)/n psi b), Adam updates it, all-gather of the updated parameters ((n-1)/n psi b);
- stage 2: as 1, but each layer's gradients are reduce-scattered during backward, as soon as
  autograd has produced them (post-accumulate-grad hooks), and the full ones are dropped;
- stage 3: as 2, and only the shard of the parameters is kept: a layer's parameters are
  all-gathered just before its forward (module pre-hook), freed after it, all-gathered again
  when the gradient of its output arrives in backward (a tensor hook), and freed once its
  gradients are reduce-scattered. 3 (n-1)/n psi b. A weight two layers share (the GPT's head
  reuses its embedding's) lives in the first layer's buffer and is gathered for each use: the
  embedding layer travels once more per step.

`mixed_precision=True`: the model runs in 16-bit (`param_dtype`, bf16 by default: no loss
scaling needed), gradients are 16-bit and are reduced in 16-bit, and Adam updates fp32 master
weights (its own shard of them), copied back to 16-bit after every step: K = 12 bytes per
parameter of optimizer state, as in the paper.

Memory is measured from the tensors this rank really holds (`memory()`), pushed to the device's
tracker (so a simulated device raises `SimulatedOutOfMemoryError` when it overflows), and
compared with `pipelib.data_parallel.zero_formulas` by the tests and chapter 08.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch

from pipelib.comm import collectives as C
from pipelib.data_parallel.zero_formulas import check_stage
from pipelib.data_parallel.zero_units import build_units
from pipelib.runtime.device import current


class ZeRO:
    """Data parallelism with ZeRO stage 0, 1, 2 or 3 and torch's Adam (or AdamW)."""

    def __init__(self, model: torch.nn.Module, group=None, *, stage: int = 1, lr: float = 1e-3,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, adamw: bool = False,
                 mixed_precision: bool = False, param_dtype=torch.bfloat16, check: bool = True):
        import torch.distributed as dist

        from pipelib.data_parallel.replicas import check_same_parameters

        self.stage = check_stage(stage)
        if mixed_precision and param_dtype != torch.bfloat16:
            raise ValueError(f"ZeRO: param_dtype={param_dtype}; mixed precision here keeps bf16 parameters "
                             f"(torch.bfloat16). fp16 would also need loss scaling (small gradients "
                             f"underflow), which this class does not do")
        self.group, self.n, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        if self.rank < 0:
            raise ValueError(f"rank {dist.get_rank()}: ZeRO on a group this rank is not part of")
        if check:
            check_same_parameters(model, group)
        self.model, self.mixed = model, bool(mixed_precision)
        self.dtype = param_dtype if self.mixed else torch.float32
        self.units, self.uses = build_units(model, self.n, self.rank, self.dtype)
        self.dev = current()
        self.dev.memory = self.dev.fresh_memory()
        self.comm_bytes_now = self.comm_peak = 0
        for u in self.units:
            if self.stage <= 1:  # full gradients, as views of one flat buffer per layer
                u.gflat = torch.zeros(u.padded, dtype=self.dtype)
                for (o, k), (_, p) in zip(u.offsets, u.params):
                    p.grad = u.gflat[o:o + k].view(p.shape)
            else:
                u.gshard = torch.zeros(u.shard, dtype=self.dtype)
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
        opt = torch.optim.AdamW if adamw else torch.optim.Adam
        self.optimizer = opt([u.master for u in self.units], lr=lr, betas=betas, eps=eps,
                             weight_decay=weight_decay)
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
        return self.model(*args, **kwargs)

    def _comm(self, nbytes: int) -> None:
        """Count a communication buffer allocated (+) or dropped (-)."""
        if nbytes > 0:
            self.dev.memory.add("buffers", nbytes, "communication buffer")
        else:
            self.dev.memory.bytes["buffers"] += nbytes
        self.comm_bytes_now += nbytes
        self.comm_peak = max(self.comm_peak, self.comm_bytes_now)

    def _gather(self, u) -> None:
        if u.gathered:
            return
        self.dev.memory.add("parameters", u.nbytes, f"parameters of {u.name}")
        self._comm(u.nbytes)
        u.restore(C.all_gather(u.mine, group=self.group))
        self._comm(-u.nbytes)

    def _free(self, u) -> None:
        self.dev.memory.bytes["parameters"] -= u.release()

    def _pre_forward(self, mod, args):
        for u in self.uses[mod]:
            self._gather(u)

    def _post_forward(self, mod, args, out):
        for u in self.uses[mod]:
            self._free(u)
        outs = [out] if torch.is_tensor(out) else [o for o in out if torch.is_tensor(o)] \
            if isinstance(out, (tuple, list)) else []
        t = next((o for o in outs if o.requires_grad), None)
        if t is not None:  # its gradient arrives just before this module's backward runs
            t.register_hook(lambda g, mod=mod: self._pre_backward(mod))

    def _pre_backward(self, mod):
        for u in self.uses[mod]:
            self._gather(u)

    def _grad_ready(self, p) -> None:
        self.dev.memory.add("gradients", p.grad.numel() * p.grad.element_size(), "gradient")
        u = self._unit_of[id(p)]
        u.pending -= 1
        if u.pending == 0:
            self._reduce_unit(u)

    def _reduce_unit(self, u) -> None:
        """Stages 2-3: reduce-scatter one layer's gradients into this rank's shard, drop them."""
        flat = u.flat_grads()
        self._comm(flat.numel() * flat.element_size())
        self.dev.memory.bytes["gradients"] -= sum(p.grad.numel() * p.grad.element_size()
                                                 for _, p in u.params if p.grad is not None)
        for _, p in u.params:
            p.grad = None
        u.gshard.add_(C.reduce_scatter(flat, op="avg", group=self.group))
        self._comm(-flat.numel() * flat.element_size())
        u.pending = len(u.params)
        if self.stage == 3:
            self._free(u)

    # ------------------------------------------------------------------ the optimizer step
    def step(self) -> None:
        """Average the gradients (the stage's collective), one Adam step on this rank's shard,
        and bring every rank's parameters up to date."""
        grads = []
        for u in self.units:
            if self.stage >= 2 and u.pending != len(u.params):  # a parameter got no gradient
                self._reduce_unit(u)
            if self.stage == 0:
                grads.append(C.all_reduce(u.gflat, op="avg", group=self.group))
            elif self.stage == 1:  # the shard's averaged gradient: counted with the gradients
                grads.append(C.reduce_scatter(u.gflat, op="avg", group=self.group))
            else:
                grads.append(u.gshard)
        for u, g in zip(self.units, grads):
            u.master.grad = g.float() if self.mixed else g
        self.sync_memory()  # the gradients handed to Adam (fp32 copies in mixed precision)
        self.optimizer.step()
        self.sync_memory()  # Adam's moments appear at its first step: an out-of-memory shows here
        with torch.no_grad():
            for u in self.units:
                u.master.grad = None
                if self.mixed:
                    (u.flat if self.stage == 0 else u.mine if self.stage == 3 else u.local()).copy_(u.master)
                if self.stage in (1, 2):
                    self._comm(u.nbytes)
                    u.flat.copy_(C.all_gather(u.local(), group=self.group))
                    self._comm(-u.nbytes)
        self.sync_memory()

    def zero_grad(self) -> None:
        for u in self.units:
            (u.gflat if self.stage <= 1 else u.gshard).zero_()

    # ------------------------------------------------------------------ measured bytes
    def memory(self) -> dict:
        """Bytes this rank holds now, by category, measured from the tensors themselves (each
        storage counted once): parameters, gradients, optimizer (Adam's moments and step
        counters, plus the fp32 master weights in mixed precision), comm buffers (the all-gather
        outputs and flattened gradients this wrapper allocates: now, peak) and the ring's scratch
        chunks kept on the device (`pipelib.comm.ring`, shared by every collective)."""
        def size(ts):
            seen = {}
            for t in ts:
                if t is not None:
                    st = t.untyped_storage()
                    seen[st.data_ptr() if st.nbytes() else id(t)] = st.nbytes()
            return sum(seen.values())

        params = [u.flat for u in self.units] + [getattr(u, "mine", None) for u in self.units]
        grads = [getattr(u, "gflat", None) for u in self.units] + [getattr(u, "gshard", None) for u in self.units]
        grads += [p.grad for u in self.units for _, p in u.params] + [u.master.grad for u in self.units]
        state = [v for st in self.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        masters = [u.master for u in self.units] if self.mixed else []
        return {"parameters": size(params), "gradients": size(grads), "optimizer": size(state + masters),
                "comm buffers": self.comm_bytes_now, "comm peak": self.comm_peak,
                "ring scratch": size(self.dev.scratch.values())}

    def sync_memory(self) -> dict:
        """Measure (`memory`) and set the device tracker's categories (may raise a simulated OOM)."""
        m = self.memory()
        mem = self.dev.memory
        mem.set("parameters", m["parameters"], "parameters")
        mem.set("gradients", m["gradients"], "gradients")
        mem.set("optimizer", m["optimizer"], "optimizer state (Adam)")
        return m

    # ------------------------------------------------------------------ checks (untraced)
    def full_parameters(self) -> dict:
        """{name: fp32 tensor} of the whole model (the master weights in mixed precision),
        gathered with raw gloo collectives: a check, kept off the trace and the clock."""
        return self._full(lambda u: u.master.detach().float() if self.stage else u.master.detach().float()[u.lo:u.hi])

    def full_gradients(self) -> dict:
        """{name: fp32 tensor}: the averaged gradients of the last backward (call before `step`
        for stages 2-3, whose shards are reduced during backward; stages 0-1 are averaged here)."""
        import torch.distributed as dist

        out = {}
        for u in self.units:
            if self.stage <= 1:
                g = u.gflat.detach().float().clone()
                dist.all_reduce(g, group=self.group)
                out.update(u.unflatten(g / self.n))
            else:
                out.update(self._full_unit(u, u.gshard.detach().float()))
        return out

    def _full(self, local) -> dict:
        out = {}
        for u in self.units:
            out.update(self._full_unit(u, local(u)))
        return out

    def _full_unit(self, u, piece) -> dict:
        import torch.distributed as dist

        parts = [torch.empty_like(piece) for _ in range(self.n)]
        dist.all_gather(parts, piece.contiguous(), group=self.group)
        return u.unflatten(torch.cat(parts))
