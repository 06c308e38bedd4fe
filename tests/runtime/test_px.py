"""`%%px` cells: an engine error prints one line naming the rank (not the engine id), and an
error saying torch.distributed's group is dead marks the cluster broken, as `Cluster.run` does
(`pipelib.runtime.px`). One 2-rank cluster, driven from an in-process IPython shell."""
from __future__ import annotations

import pytest

from pipelib.runtime.cluster import Cluster
from pipelib.runtime.errors import ClusterError
from pipelib.runtime.px import install, rank_errors


@pytest.fixture(scope="module")
def shell_and_cluster():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    c = Cluster(2, timeout=30)
    c.view.activate()  # what Cluster.start does in a notebook (`_activate_px`)
    assert install(c, shell)
    yield shell, c
    c.stop()
    InteractiveShell.clear_instance()


def _px(shell, capsys, code: str) -> str:
    capsys.readouterr()
    shell.run_cell("%%px\n" + code)
    out = capsys.readouterr()
    return out.out + out.err


def test_an_error_on_one_rank_in_a_px_cell_names_the_rank_in_one_line(shell_and_cluster, capsys):
    shell, c = shell_and_cluster
    out = _px(shell, capsys, "if rank == 1:\n    raise ValueError(f'bad batch on rank {rank}')")
    assert "rank 1 raised ValueError: bad batch on rank 1 in %%px" in out, out
    assert "rank 0 raised" not in out and "restart" not in out, out
    assert c.run(sum, [1, 2]) == [3, 3]  # a plain error leaves the cluster usable


def test_a_px_cell_whose_process_group_died_marks_the_cluster_broken(shell_and_cluster, capsys):
    shell, c = shell_and_cluster
    out = _px(shell, capsys, "if rank == 0:\n    raise RuntimeError('[gloo] Connection closed by peer [127.0.0.1]')")
    assert "rank 0 raised RuntimeError: [gloo] Connection closed by peer [127.0.0.1] in %%px" in out, out
    assert "call cluster.restart() to continue" in out, out
    with pytest.raises(ClusterError, match=r"^the cluster is unusable after torch\.distributed failed on rank\(s\) "
                                           r"\[0\] in %%px .*: call cluster\.restart\(\)"):
        c.run(sum, [1, 2])
    # a %%px cell on the broken cluster is refused with the same line, and never reaches the engines
    res = shell.run_cell("%%px\nimport os; os.environ['PIPELIB_PX_RAN'] = '1'")
    assert isinstance(res.error_in_exec, ClusterError), res.error_in_exec
    assert "call cluster.restart() to continue" in str(res.error_in_exec)
    assert shell.run_cell("%px 1 + 1").error_in_exec is not None
    assert c.view.apply_sync(lambda: __import__("os").environ.get("PIPELIB_PX_RAN")) == [None, None]
    c.restart()
    c.view.activate()
    install(c, shell)  # what Cluster.start does after a restart: one guard per shell, the new cluster's
    assert len([t for t in shell.input_transformers_cleanup if t is shell._pipelib_px_guard]) == 1
    assert c.run(sum, [1, 2]) == [3, 3]
    assert shell.run_cell("%%px\nx = rank").error_in_exec is None  # the restarted cluster runs %%px again
    assert c.view.pull("x", block=True) == [0, 1]


def test_errors_that_did_not_come_from_the_engines_are_left_alone(shell_and_cluster):
    _, c = shell_and_cluster
    assert rank_errors(c, ValueError("local")) == {}
