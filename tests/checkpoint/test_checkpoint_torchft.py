"""torchft beside pipelib's restart: two replica processes and a lighthouse, spawned without a
cluster; one replica is lost for good after step 3 and the other goes on without a restart.

What must hold: the quorum of every step (2, 2, 2 and then 1, 1, 1), the replicas identical
when one leaves (one data-parallel model), the losses while both run equal to one process
training the whole global batch (each replica reads its half), the lost replica's steps
0-2 only, and no process left behind.
"""
import multiprocessing

import pytest


def _recipe(steps):
    from pipelib.model import GPTConfig
    from pipelib.recipe import Recipe

    return Recipe(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64),
                  batch_size=8, steps=steps, lr=1e-2)


def test_torchft_goes_on_with_the_replica_left_and_matches_one_process_before():
    from pipelib.checkpoint.torchft_twin import run_torchft

    run = run_torchft(_recipe(6), replicas=2, steps=6, lose=1, lose_after=3, deadline_s=240)
    assert run.participants == (2, 2, 2, 1, 1, 1)
    assert run.replicas_equal, "the two replicas held different parameters after step 3"
    assert [r["steps"] for r in run.per_replica] == [[0, 1, 2, 3, 4, 5], [0, 1, 2]]
    reference = _recipe(3).reference().losses  # one process, the whole batch, 3 steps
    assert run.losses[:3] == pytest.approx(reference, abs=1e-5), (run.losses, reference)
    assert multiprocessing.active_children() == []


def test_torchft_refuses_a_loss_with_no_step_before_or_after():
    from pipelib.checkpoint.torchft_twin import run_torchft

    with pytest.raises(ValueError, match="lose_after=6 with replicas=2, steps=6"):
        run_torchft(_recipe(6), steps=6, lose_after=6)
    with pytest.raises(ValueError, match="lose=2"):
        run_torchft(_recipe(6), lose=2)
    assert multiprocessing.active_children() == []
