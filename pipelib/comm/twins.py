"""torch.distributed's built-in for each collective, with the from-scratch one's semantics.

Each twin takes what `CollectiveInfo.run` takes, (tensor, group, root=, op=), with the root a
*group* rank, and returns what the from-scratch collective returns: the tensor reduced or
broadcast in place, a new tensor for all_gather, reduce_scatter, all_to_all and gather (None
off the root), None for the barrier. gloo has no "avg": the twins sum and divide, as ours do.
They are the reference of the tests, of chapter 06's demos and of the lab's races
(`pipelib.comm.lab.measure_collective(builtin=True)`); `pipelib.comm.registry` pairs each with
its collective. torch is imported when a twin runs, so the registry stays pure.

Introduced in chapter 06.
"""
from __future__ import annotations


def _dist():
    import torch.distributed as dist

    return dist


def _op(op: str):
    dist = _dist()
    return {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(op, dist.ReduceOp.SUM)


def _global(group, root: int) -> int:
    return root if group is None else _dist().get_global_rank(group, root)


def _average(x, group, op: str):
    return x.div_(_dist().get_world_size(group)) if op == "avg" else x


def torch_broadcast(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.broadcast` from group rank `root`, in place."""
    _dist().broadcast(x, _global(group, root), group=group)
    return x


def torch_reduce(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.reduce` to group rank `root`, in place (other ranks' buffers: unspecified)."""
    dist = _dist()
    dist.reduce(x, _global(group, root), op=_op(op), group=group)
    return _average(x, group, op) if dist.get_rank(group) == root else x


def torch_all_reduce(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.all_reduce`, in place: the twin of every all-reduce algorithm."""
    _dist().all_reduce(x, op=_op(op), group=group)
    return _average(x, group, op)


def torch_reduce_scatter(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.reduce_scatter_tensor`: chunk r of the reduction, dim 0. gloo's needs dim 0
    divisible by n; other sizes get the same result from `dist.all_reduce`, then chunk r."""
    import torch

    dist = _dist()
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[0] % n:
        full = x.clone()
        dist.all_reduce(full, op=_op(op), group=group)
        return _average(torch.tensor_split(full, n)[me].clone(), group, op)
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous(), op=_op(op), group=group)
    return _average(out, group, op)


def torch_all_gather(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.all_gather_into_tensor`: every rank's x along dim 0, in rank order."""
    import torch

    dist = _dist()
    x = x.reshape(1) if x.dim() == 0 else x
    out = torch.empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def torch_all_to_all(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.all_to_all_single` with tensor_split's chunk sizes: chunk j to rank j, at slot r."""
    import torch

    dist = _dist()
    n, me = dist.get_world_size(group), dist.get_rank(group)
    sz = [c.shape[0] for c in x.tensor_split(n)]  # torch's own cut, the definition chunk_sizes follows
    out = torch.empty((n * sz[me], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=[sz[me]] * n, input_split_sizes=sz,
                           group=group)
    return out


def torch_all_to_all_uneven(x, group=None, *, root: int = 0, op: str = "sum", input_splits=None,
                            output_splits=None):
    """`dist.all_to_all_single` with split sizes (`pipelib.comm.uneven`'s semantics): without
    splits `torch_all_to_all`; without output splits the counts are exchanged first, by gloo."""
    import torch

    dist = _dist()
    if input_splits is None:
        return torch_all_to_all(x, group)
    if output_splits is None:
        counts = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=x.device)
        dist.all_to_all_single(counts, torch.tensor(list(input_splits), dtype=torch.int64, device=x.device),
                               group=group)
        output_splits = counts.tolist()
    out = torch.empty((sum(output_splits), *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=list(output_splits),
                           input_split_sizes=list(input_splits), group=group)
    return out


def torch_gather(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.gather` to group rank `root`: every rank's x along dim 0 there, None elsewhere."""
    import torch

    dist = _dist()
    x = x.reshape(1) if x.dim() == 0 else x
    mine = dist.get_rank(group) == root
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))] if mine else None
    dist.gather(x.contiguous(), parts, dst=_global(group, root), group=group)
    return torch.cat(parts) if mine else None


def _block_sizes(x, group):
    """Group rank `root`'s x cut in n equal blocks along dim 0 (scatter's list), this rank's
    output buffer."""
    import torch

    dist = _dist()
    n = dist.get_world_size(group)
    if x.shape[0] % n:
        raise ValueError(f"scatter: dim 0 of {tuple(x.shape)} does not split into {n} equal blocks; "
                         f"pass a tensor whose first dimension is a multiple of {n}")
    blocks = list(x.chunk(n))
    return blocks, torch.empty_like(blocks[0])


def torch_scatter(x, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.scatter` from group rank `root`: rank r gets block r of the root's x (dim 0)."""
    blocks, out = _block_sizes(x, group)
    mine = _dist().get_rank(group) == root
    _dist().scatter(out, [b.contiguous() for b in blocks] if mine else None, src=_global(group, root),
                    group=group)
    return out


def call_scatter(fn, x, group, root, op, kw):
    """How `CollectiveInfo.run` calls `scatter_tree`: the root's x cut as `scatter`'s twin cuts it."""
    blocks, out = _block_sizes(x, group)
    mine = _dist().get_rank(group) == root
    return fn(out, blocks if mine else None, src=root, group=group, **kw)


def scatter_block(shape: tuple, n: int) -> tuple:
    """The shape of one rank's block of a tensor of `shape` scattered over n ranks."""
    return (shape[0] // n, *shape[1:])


def torch_barrier(x=None, group=None, *, root: int = 0, op: str = "sum"):
    """`dist.barrier`; x is ignored."""
    _dist().barrier(group=group)


def call_barrier(fn, x, group, root, op, kw):
    """How `CollectiveInfo.run` calls the barrier: it takes no tensor."""
    return fn(group=group, **kw)
