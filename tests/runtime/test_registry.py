"""The registry of running clusters, without starting one (tests/runtime/test_cluster.py starts one)."""
import pytest

from pipelib.runtime.cluster import Cluster
from pipelib.runtime.registry import LiveClusters


class _Fake:
    def __init__(self, registry):
        self.registry, self.stopped = registry, 0

    def stop(self):
        self.stopped += 1
        self.registry.discard(self)


def test_stop_all_stops_each_running_cluster_once_and_empties_the_registry():
    live = LiveClusters()
    a, b = _Fake(live), _Fake(live)
    live.add(a)
    live.add(b)
    assert a in live and len(live) == 2
    live.stop_all()
    assert (a.stopped, b.stopped, len(live)) == (1, 1, 0)
    live.stop_all()  # nothing left to stop
    assert (a.stopped, b.stopped) == (1, 1)


def test_a_cluster_not_started_is_not_registered_and_stops_quietly():
    c = Cluster(2, start=False)
    assert c not in Cluster.live and not c.running and "stopped" in repr(c)
    c.stop()
    assert c not in Cluster.live


@pytest.mark.parametrize("world_size, match", [
    (0, r"^Cluster: world_size=0; pass an integer >= 1 \(ranks, one engine each\)$"),
    (65, r"^Cluster: world_size=65; pass at most 64 "),
])
def test_world_size_is_checked_before_anything_starts(world_size, match):
    with pytest.raises(ValueError, match=match):
        Cluster(world_size, start=False)
