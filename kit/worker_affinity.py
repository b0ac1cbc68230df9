"""Which pytest-xdist worker runs which group (`--dist loadgroup`; kit.pytest_plugin groups
the runs by backend, mode and kernel variant): each worker keeps to one backend while that
backend has groups left. A worker's first run of a backend loads it (CUDA context, imports,
kernels: 3-6 s on the H100 for FlashInfer's and for Triton's), and xdist's own order gave
every one of 16 workers every backend: 107 of the 279 worker-seconds of the in-box matrix
were such first runs. A worker without a backend takes the one with the most pending runs
per worker on it; when its backend's groups are gone it moves on by the same rule, so the
last groups still spread over every worker."""
from __future__ import annotations

import collections
from typing import Dict, Iterable

from xdist.scheduler import LoadGroupScheduling


class BackendAffinityScheduling(LoadGroupScheduling):
    def __init__(self, config, log=None, labels: Iterable[str] = ()):
        super().__init__(config, log)
        self._labels = sorted(labels, key=len, reverse=True)  # the longest label a group starts with
        self._backend_of: Dict[object, str] = {}

    def backend(self, group: str) -> str:
        return next((label for label in self._labels if group.startswith(label + "-")), group)

    def _assign_work_unit(self, node) -> None:
        pending = collections.Counter()
        for group, runs in self.workqueue.items():
            pending[self.backend(group)] += len(runs)
        backend = self._backend_of.get(node)
        if not pending[backend]:
            crowd = collections.Counter(b for n, b in self._backend_of.items() if n is not node and n in self.nodes)
            backend = max(pending, key=lambda b: pending[b] / (1 + crowd[b]))
            self._backend_of[node] = backend
        group = next(g for g in self.workqueue if self.backend(g) == backend)
        self.workqueue.move_to_end(group, last=False)  # xdist assigns the queue's first group
        super()._assign_work_unit(node)
