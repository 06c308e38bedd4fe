"""Sub-groups for the collective tests, made once per engine and shared by every test module.

`dist.new_group` is collective: every rank of the world must call it, in the same order. The
first call makes all of them, in one fixed order, on every rank."""
_GROUPS: dict = {}


def group(ranks):
    """The process group of `ranks`, one of (0, 1), (1, 2, 3) and (0, 1, 2, 3)."""
    import torch.distributed as dist

    if not _GROUPS:
        for rs in ((0, 1), (1, 2, 3), (0, 1, 2, 3)):
            _GROUPS[rs] = dist.new_group(list(rs))
    return _GROUPS[tuple(ranks)]
