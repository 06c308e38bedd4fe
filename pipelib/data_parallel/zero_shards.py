"""What a ZeRO rank holds, read out: its gradient shards, whole tensors, and its checkpoint.

- `grad_shards()`: {name: 1-D tensor}, each trainable parameter's piece of the averaged
  gradient that this rank's optimizer reads (FSDP2 leaves a sharded gradient on every
  parameter; ZeRO's shards are cut from a unit's flat buffer, so a piece is elements
  [start, stop) of p.view(-1), `shard_ranges()`, possibly empty). Stage 0 holds everything.
- `placements()`: {name: `pipelib.placement.Placement`} with each parameter's `FlatSlice` (its
  unit and offset in the flat buffer) on the "dp" axis; `local_shards()` this rank's shard of
  every unit; `pipelib.placement.unshard` puts them back together (a resharding checkpoint,
  chapter 18, reads the same records);
- `full_gradients()`, `full_parameters()`: {name: fp32 tensor, parameter-shaped}, gathered
  by `unshard` with raw collectives of torch.distributed: a check, kept off the trace and the clock;
  `reduced_gradients()`: the same after the stage's own reduction, as the optimizer reads them
  (so a bf16 reduction's rounding shows; stages 0-1's `full_gradients` average in fp32).
- `clip_grad_norm_()`: global-norm clipping with sharded gradients (one all-reduce of a scalar);
- `state_dict()` / `load_state_dict()`: this rank's shard of every unit (the fp32 master weights
  in mixed precision) and its optimizer's `state_dict()`: what a sharded checkpoint saves per rank.

Introduced in chapter 08.
"""
from __future__ import annotations

import torch


class ZeROShards:
    """The read-out half of `pipelib.data_parallel.zero.ZeRO`."""

    def _span(self, u) -> tuple[int, int]:
        """The part of unit `u`'s flat buffer this rank's optimizer updates."""
        return (0, u.padded) if self.stage == 0 else (u.lo, u.hi)

    def shard_ranges(self) -> dict:
        """{name: (start, stop)}: which elements of each trainable parameter (flattened) this
        rank's optimizer updates; (0, 0) for a parameter wholly on other ranks."""
        return {name: (a, b) for u in self.units for name, a, b, _ in u.pieces(*self._span(u))}

    def grad_shards(self) -> dict:
        """{name: 1-D tensor}: this rank's piece of each trainable parameter's averaged gradient
        (elements `shard_ranges()[name]` of p.grad.view(-1)), as the optimizer reads it (fp32 in
        mixed precision). Call after backward, before `step`: it averages the gradients first
        if that has not happened yet (stages 0-1: the stage's collective). Views: clipping
        them (in place) clips what the step applies."""
        self.reduce_gradients()
        out = {}
        for u in self.units:
            g = u.master.grad
            for name, a, b, at in u.pieces(*self._span(u)):
                out[name] = g[at:at + b - a]
        return out

    def placements(self) -> dict:
        """{name: Placement}: each trainable parameter's slice of its unit's flat buffer, cut in
        equal shards over the "dp" axis (stage 0 too: its optimizer holds the whole buffer, but
        the same cut reads its master weights back)."""
        from pipelib.placement import FlatSlice, Placement

        return {n: Placement(axis="dp", flat=FlatSlice(u.name, o, k, tuple(p.shape)))
                for u in self.units for (o, k), (n, p) in zip(u.offsets, u.params)}

    def local_shards(self, what: str = "param") -> dict:
        """{unit name: 1-D fp32 tensor}: this rank's shard of each unit's master weights
        ("param") or of the averaged gradients as the optimizer reads them ("grad")."""
        out = {}
        for u in self.units:
            t = (u.master if what == "param" else u.master.grad).detach().float()
            out[u.name] = t[u.lo:u.hi] if self.stage == 0 else t
        return out

    def _unshard(self, shards: dict) -> dict:
        from pipelib.placement import unshard

        return unshard(shards, self.placements(), {"dp": self.group})

    def full_parameters(self) -> dict:
        """{name: fp32 tensor} of the whole model's trainable parameters (the master weights in
        mixed precision), gathered by placement with raw torch.distributed collectives: a check, off the
        trace and the clock."""
        return self._unshard(self.local_shards("param"))

    def full_gradients(self) -> dict:
        """{name: fp32 tensor}: the averaged gradients of the last backward (call before `step`
        for stages 2-3, whose shards are reduced during backward; stages 0-1 are averaged here)."""
        import torch.distributed as dist

        if self.stage >= 2:
            return self._unshard({u.name: u.gshard.detach().float() for u in self.units})
        out, replicas = {}, 1 if self.replicate is None else dist.get_world_size(self.replicate)
        for u in self.units:
            g = u.gflat.detach().float().clone()
            dist.all_reduce(g, group=self.group)
            if self.replicate is not None:  # HSDP: the other replicas' rows too
                dist.all_reduce(g, group=self.replicate)
            out.update(u.unflatten(g / (self.n * replicas)))
        return out

    def reduced_gradients(self) -> dict:
        """{name: fp32 tensor}: the averaged gradients as this rank's optimizer reads them, after
        the stage's own reduction (in the gradients' dtype: bf16 or fp32), gathered whole with
        raw torch.distributed collectives (a check). Call after backward, before `step`; it runs the stage's
        reduction first if that has not happened yet, as `grad_shards` does."""
        self.reduce_gradients()
        if self.stage == 0:
            return {k: v for u in self.units for k, v in u.unflatten(u.master.grad.detach().float()).items()}
        return self._unshard(self.local_shards("grad"))

    def clip_grad_norm_(self, max_norm: float, eps: float = 1e-6) -> float:
        """Global-norm clipping of sharded gradients (torch.nn.utils.clip_grad_norm_'s rule):
        each rank sums the squares of its shard of the averaged gradients, one all-reduce of
        that single fp32 number (4 bytes of payload) gives the whole model's norm on every rank
        (stage 0 holds everything: no message), and every shard is scaled by max_norm / (norm +
        eps) when that is below 1. Call after backward, before `step`; returns the norm."""
        from pipelib.comm import collectives as C

        self.reduce_gradients()
        grads = [u.master.grad for u in self.units]
        sq = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum().reshape(1)
        if self.stage >= 1 and self.n > 1:
            sq = C.all_reduce(sq, group=self.group, label="grad norm")
        norm = float(sq.sqrt())
        coef = max_norm / (norm + eps)
        if coef < 1:
            for g in grads:
                g.mul_(coef)
        return norm

    def skip_step(self) -> None:
        """Drop this step's gradients without stepping (a NaN or an Inf on some rank: every rank
        of the group calls it, after `reduce_gradients`, so that no shard is stepped alone).
        The next backward starts from zero, as after `step` and `zero_grad`. Chapter 18."""
        for u in self.units:
            u.master.grad = None
        self._reduced = False
        self.zero_grad()

    # ------------------------------------------------------------------ checkpoint of this rank
    def state_dict(self) -> dict:
        """This rank's shards (one 1-D tensor per unit, cloned) and its optimizer's state."""
        return {"stage": self.stage, "world_size": self.n, "rank": self.rank,
                "units": [u.numel for u in self.units],
                "shards": [u.master.detach().clone() for u in self.units],
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Load what `state_dict` saved on this rank, for the same model, stage and group size;
        every rank of the group calls it (stages 1-2 all-gather the loaded shards)."""
        mine = {"stage": self.stage, "world_size": self.n, "rank": self.rank,
                "units": [u.numel for u in self.units]}
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(f"ZeRO.load_state_dict: saved for {theirs}, this wrapper is {mine}; load a "
                             f"rank's checkpoint into the same model, stage and group size")
        with torch.no_grad():
            for u, t in zip(self.units, state["shards"]):
                u.master.copy_(t)
        self.optimizer.load_state_dict(state["optimizer"])
        self._publish()
        self.sync_memory()
