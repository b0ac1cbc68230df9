"""Which pytest-xdist worker runs which group (`--dist loadgroup`; kit.pytest_plugin's
_groups: a backend's runs of one mode and kernel variant): a group goes to one worker, and
each worker keeps to one backend while that backend has groups left. A worker's first run
of a backend loads it (CUDA context, imports, kernels: 3-6 s on the H100 for FlashInfer's
and for Triton's), and xdist's own order gave every one of 16 workers every backend: 107 of
the 279 worker-seconds of the in-box matrix were such first runs. A worker without a
backend takes the one with the most pending runs per worker on it; when its backend's
groups are gone it moves on by the same rule, so the last groups still spread over every
worker."""
from __future__ import annotations

import collections
from typing import Callable, Dict, Optional, Tuple

from xdist.scheduler import LoadGroupScheduling


class BackendAffinityScheduling(LoadGroupScheduling):
    def __init__(self, config, log=None, group_of: Callable[[str], Optional[Tuple[str, str]]] = lambda _: None):
        """`group_of`: a node id's (group, backend); None: a scope as xdist's loadgroup has it."""
        super().__init__(config, log)
        self._group_of = group_of
        self._backend_of_group: Dict[str, str] = {}
        self._backend_of: Dict[object, str] = {}

    def _split_scope(self, nodeid: str) -> str:
        found = self._group_of(nodeid)
        group, backend = found if found else (super()._split_scope(nodeid),) * 2  # its own backend
        self._backend_of_group[group] = backend
        return group

    def _assign_work_unit(self, node) -> None:
        pending = collections.Counter()
        for group, runs in self.workqueue.items():
            pending[self._backend_of_group[group]] += len(runs)
        backend = self._backend_of.get(node)
        if not pending[backend]:
            crowd = collections.Counter(b for n, b in self._backend_of.items() if n is not node and n in self.nodes)
            backend = max(pending, key=lambda b: pending[b] / (1 + crowd[b]))
            self._backend_of[node] = backend
        group = next(g for g in self.workqueue if self._backend_of_group[g] == backend)
        self.workqueue.move_to_end(group, last=False)  # xdist assigns the queue's first group
        super()._assign_work_unit(node)
