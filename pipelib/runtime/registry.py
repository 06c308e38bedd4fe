"""The clusters running in this process, stopped when the interpreter exits normally.

No orphans, first line: a notebook that ends, a test session that finishes, a script that
returns all stop their clusters here, even a cluster whose variable was overwritten (a cell run
twice), since the registry holds every running one strongly. A kernel killed with SIGKILL runs
no exit handler: that is the second line, `pipelib.runtime.watchdog`.

`Cluster.live` is the one registry; a cluster adds itself once started and discards itself
when stopped. Introduced in chapter 04.
"""
from __future__ import annotations

import atexit


class LiveClusters:
    """A set of running clusters whose `stop_all` runs at interpreter exit."""

    def __init__(self):
        self._clusters: set = set()
        atexit.register(self.stop_all)

    def add(self, cluster) -> None:
        self._clusters.add(cluster)

    def discard(self, cluster) -> None:
        self._clusters.discard(cluster)

    def __contains__(self, cluster) -> bool:
        return cluster in self._clusters

    def __len__(self) -> int:
        return len(self._clusters)

    def stop_all(self) -> None:
        """Stop every cluster still running (each one's `stop` discards it from here)."""
        for c in list(self._clusters):
            c.stop()
