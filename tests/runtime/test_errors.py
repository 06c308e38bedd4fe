"""The cluster's error messages, built without a cluster: every rank, what it did, what to change."""
from types import SimpleNamespace

from pipelib.runtime.errors import (
    ClusterError,
    RankDiedError,
    RankError,
    RankTimeoutError,
    died_message,
    raised_message,
    stuck_message,
)


def _remote(ename, evalue, traceback=None):  # the fields of an ipyparallel RemoteError
    return SimpleNamespace(ename=ename, evalue=evalue, traceback=traceback)


def test_every_fault_is_a_cluster_error_and_a_timeout_is_a_timeout():
    assert issubclass(RankError, ClusterError) and issubclass(RankDiedError, ClusterError)
    assert issubclass(RankTimeoutError, ClusterError) and issubclass(RankTimeoutError, TimeoutError)
    assert RankTimeoutError("m", [1, 2]).ranks == [1, 2] and RankError("m", {0: "e"}).errors == {0: "e"}


def test_raised_message_names_each_rank_and_keeps_only_the_readers_frames():
    tb = ("\x1b[31mTraceback\x1b[0m\n  in _run_on_rank\n    return fn(*args, **kwargs)\n"
          "  File \"mine.py\", line 3, in step\n    raise ValueError('bad')\n")
    msg = raised_message({2: _remote("KeyError", "'x'"), 1: _remote("ValueError", "bad", tb)}, "step")
    assert msg.splitlines()[:3] == ["rank 1 raised ValueError: bad in step",
                                    "rank 2 raised KeyError: 'x' in step",
                                    "--- traceback on rank 1 ---"]
    assert 'File "mine.py", line 3, in step' in msg
    assert "_run_on_rank" not in msg and "\x1b[" not in msg


def test_died_and_stuck_messages_say_what_each_rank_was_doing_and_what_to_do():
    acts = {0: "recv from rank 1 (for 2.0 s)", 1: "compute F (for 0.1 s)", 2: "idle"}
    died = died_message([1], "step", acts, {1: "died", 0: _remote("RuntimeError", "gloo")})
    assert died == ("rank 1 died while running step; it was doing: compute F (for 0.1 s)\n"
                    "rank 0 then failed: RuntimeError: gloo\nCall cluster.restart() to continue.")
    stuck = stuck_message([0, 2], "step", 1.5, acts, {}, broken=False)
    assert stuck.startswith("rank 0 did not finish step within 1.5 s; it was doing: recv from rank 1")
    assert "rank 2 did not finish step within 1.5 s" in stuck and "raise timeout=" in stuck
    assert "restart" not in stuck
    after = stuck_message([0], "step", 1.5, acts, {1: _remote("ValueError", "v")}, broken=True)
    assert "rank 0 did not finish step after other ranks failed" in after
    assert "rank 1 failed: ValueError: v" in after and after.endswith("Call cluster.restart() to continue.")
