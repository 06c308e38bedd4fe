"""A crash at every step of a save: the last good checkpoint always loads, a partial one never does.

The save's steps are read from the save itself (`fault(event)` is called before, during and
after each file, and before, during and after the manifest). For each, a forked process saves
step 2 over a committed step 1 and dies there with `os._exit` (no cleanup, no `finally`, as a
killed process); the parent then loads the latest checkpoint: step 1, bit for bit, unless the
manifest of step 2 was already renamed into place (then step 2, whole). A later save of step 2
succeeds over whatever the crash left.
"""
import os

import pytest
import torch

from pipelib.checkpoint.manifest import committed_steps, read_manifest, step_dir
from pipelib.checkpoint.pieces import Piece, Split
from pipelib.checkpoint.sharded import load_whole, save_sharded

CRASH = 17


def _state(step: int) -> dict:
    """Two tensors of a step: one whole, one in a tp piece (its other half is not saved: the
    test reads pieces back, not whole tensors)."""
    g = torch.Generator().manual_seed(step)
    return {"model/w": (torch.randn(6, 4, generator=g), Piece((6, 4))),
            "optim/w/exp_avg": (torch.randn(6, 4, generator=g), Piece((6, 4))),
            "optim/w/step": (torch.tensor(float(step)), Piece(())),
            "model/v": (torch.randn(8, generator=g), Piece((8,)))}


def _events(tmp) -> list[str]:
    seen = []
    save_sharded(str(tmp / "dry"), 1, _state(1), extra={"step": 1}, fault=seen.append)
    return seen


def _crash_at(event):
    def fault(e):
        if e == event:
            os._exit(CRASH)
    return fault


def test_the_save_has_a_crash_point_before_during_and_after_each_file_and_the_manifest(tmp_path):
    events = _events(tmp_path)
    for name in ("rank-00000.pt", "manifest.json"):
        assert [e for e in events if e.endswith(name)] == [f"before {name}", f"during {name}", f"after {name}"]
    assert events.index("after rank-00000.pt") < events.index("before manifest.json")  # the manifest last


def test_a_crash_at_every_step_of_a_save_leaves_the_last_good_checkpoint(tmp_path):
    events = _events(tmp_path)
    bad = []
    for i, event in enumerate(events):
        root = str(tmp_path / f"run{i}")
        save_sharded(root, 1, _state(1), extra={"step": 1}, keep=2)
        pid = os.fork()
        if pid == 0:  # the child saves step 2 and dies at `event`
            try:
                save_sharded(root, 2, _state(2), extra={"step": 2}, keep=1, fault=_crash_at(event))
            finally:
                os._exit(0)  # never reached when the crash point is hit
        _, status = os.waitpid(pid, 0)
        died = os.waitstatus_to_exitcode(status)
        expected = 2 if event == "after manifest.json" else 1
        got = read_manifest(root).step
        whole = load_whole(root)
        same = all(torch.equal(whole[k], t) for k, (t, _) in _state(expected).items())
        if died != CRASH or got != expected or not same or committed_steps(root)[-1] != expected:
            bad.append(f"{event}: exit {died}, latest {got} (expected {expected}), bits equal {same}")
        if expected == 1:  # what the crash left is not a checkpoint, and a new save goes over it
            save_sharded(root, 2, _state(2), extra={"step": 2})
            assert read_manifest(root).step == 2
            assert all(torch.equal(load_whole(root)[k], t) for k, (t, _) in _state(2).items())
    assert not bad, "\n".join(bad)


def test_an_exception_in_a_save_is_a_crash_too(tmp_path):
    """Without a fork: an error raised mid-save leaves no committed step (nothing cleans up that
    could then fail), and the last good one loads."""
    root = str(tmp_path)
    save_sharded(root, 1, _state(1))

    def boom(e):
        if e == "during manifest.json":
            raise OSError("disk full (injected)")

    with pytest.raises(OSError, match="injected"):
        save_sharded(root, 2, _state(2), fault=boom)
    assert committed_steps(root) == [1] and os.path.isdir(step_dir(root, 2))
    assert torch.equal(load_whole(root)["model/w"], _state(1)["model/w"][0])


def test_pruning_keeps_the_last_k_and_never_the_latest(tmp_path):
    root = str(tmp_path)
    pruned = [save_sharded(root, s, _state(s), keep=2).pruned for s in range(1, 5)]
    assert committed_steps(root) == [3, 4] and pruned == [(), (), (1,), (2,)]
    assert not os.path.exists(step_dir(root, 1))


def test_pieces_round_trip_through_a_split_with_fused_blocks_and_a_flat_range():
    full = torch.arange(96.0).view(12, 8)
    for split in (Split(0, 3, 1, 2), Split(1, 1, 0, 2)):
        back = torch.zeros_like(full)
        for index in range(split.count):
            s = Split(split.dim, split.fused, index, split.count)
            n = Piece((12, 8), s).numel()
            for flat in ((0, n // 3), (n // 3, n)):
                p = Piece((12, 8), s, flat)
                p.put(back, p.cut(full))
        assert torch.equal(back, full)
    # q, k, v blocks each split alone, as tensor parallelism cuts a fused projection
    assert torch.equal(Piece((12, 8), Split(0, 3, 1, 2)).cut(full)[:2], full[2:4])
