"""Which pytest-xdist worker runs which group (`--dist loadgroup`; kit.plugin.grouping's
groups: a backend's runs of one mode and kernel variant): a group goes to one worker, and
each worker keeps to one backend while that backend has groups left. A worker's first run
of a backend loads it (CUDA context, imports, kernels), and xdist's own order gives every
worker every backend, each load paid again. A worker without a backend takes the one with the
most pending work per worker on it; when its backend's groups are gone it moves on by the same
rule, but only to a backend whose pending work outlasts a load on its workers (LOAD_RUNS runs
each), else it ends: a worker moved for a backend's last groups loads it for nothing. Pending
work is pending runs times the mean time of the backend's finished runs (runs alone before
any has finished): a backend whose runs take longer needs more workers than its run count says.
(What these rules saved on an H100: results/bench/README.md, "Why the kit schedules as it does".)

Runs start as soon as the first worker has collected: xdist's loadgroup waits for every
worker's collection, and workers started one after another and importing torch at once are
ready over seconds. A worker that collects later joins then (xdist's path for a worker
started late, e.g. after a crash); one whose collection differs fails the session's collection,
as xdist's check of every worker's collection does.

A worker that dies costs only the run it was running (remove_node): xdist records that run as a
crash, and the runs the worker had not finished go back to the front of the queue, for the other
workers and xdist's replacement one."""
from __future__ import annotations

import collections
from typing import Callable, Dict, Optional, Tuple

import pytest
from xdist.report import report_collection_diff
from xdist.scheduler import LoadGroupScheduling

from kit.plugin.progress import RunTimes


# A worker's first run of a backend costs about as much as this many other runs.
LOAD_RUNS = 8


class BackendAffinityScheduling(LoadGroupScheduling):
    def __init__(self, config, log=None, group_of: Callable[[str], Optional[Tuple[str, str]]] = lambda _: None):
        """`group_of`: a node id's (group, backend); None: a scope as xdist's loadgroup has it."""
        super().__init__(config, log)
        self._group_of = group_of
        self._backend_of_group: Dict[str, str] = {}
        self._backend_of: Dict[object, str] = {}
        self._times = RunTimes()  # per backend: runs finished and the seconds they took

    def _split_scope(self, nodeid: str) -> str:
        found = self._group_of(nodeid)
        group, backend = found if found else (super()._split_scope(nodeid),) * 2  # its own backend
        self._backend_of_group[group] = backend
        return group

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        backend = self._backend_of_group[self._split_scope(self.registered_collections[node][item_index])]
        self._times.add(backend, duration)
        super().mark_test_complete(node, item_index, duration)

    def _seconds_per_run(self, backend: Optional[str] = None) -> float:
        """The mean time of the finished runs of `backend` (of every backend where it has none);
        1 before any: pending runs then count as runs."""
        return self._times.mean(backend, default=1.0)

    @property
    def collection_is_completed(self) -> bool:
        return bool(self.registered_collections)

    def add_node_collection(self, node, collection) -> None:
        """As xdist's, but a late worker's collection that differs fails the session's collection
        (xdist's logs it only in debug and leaves the worker idle)."""
        assert node in self.assigned_work
        if self.collection is not None and list(collection) != self.collection:
            first = next(iter(self.registered_collections))
            diff = report_collection_diff(self.collection, collection, first.gateway.id, node.gateway.id)
            self.config.hook.pytest_collectreport(
                report=pytest.CollectReport(nodeid=node.gateway.id, outcome="failed", longrepr=diff, result=[]))
            return
        self.registered_collections[node] = list(collection)

    def remove_node(self, node) -> Optional[str]:
        """The run a worker that died was running (xdist records it as a crash), None where it had
        none. That run is done: run again, a run that kills its worker took the replacement worker
        down too, and the next. The runs it had not finished go back to the front of the queue,
        those alone: xdist's loadgroup put back its whole workload, finished groups too, which
        went out again as empty work that never completes (the session hung). A worker that ended
        its session with runs still pending (none should) gives them back too, without a crash."""
        workload = self.assigned_work.pop(node)
        left = [(group, [run for run, done in unit.items() if not done]) for group, unit in workload.items()]
        left = [(group, runs) for group, runs in left if runs]
        if not left:
            return None
        crashed = None if hasattr(node, "workeroutput") else left[0][1].pop(0)  # workeroutput: it finished
        for group, runs in reversed(left):
            if runs:
                self.workqueue[group] = dict.fromkeys(runs, False)
                self.workqueue.move_to_end(group, last=False)
        for other in self.nodes:
            self._reschedule(other)
        if crashed is not None:
            self._not_a_restart()
        return crashed

    def _not_a_restart(self) -> None:
        """A worker that a run took down does not count toward xdist's --max-worker-restart, which
        is there for workers that die outside runs (a collection that crashes would restart them
        forever): each run can take one worker down at most, and past the limit xdist ended the
        session with the rest of the runs never run. xdist counts the death after this call."""
        dsession = self.config.pluginmanager.getplugin("dsession")
        if isinstance(getattr(dsession, "_failed_nodes_count", None), int):
            dsession._failed_nodes_count -= 1

    def _assign_work_unit(self, node) -> None:
        if node not in self.registered_collections:  # not ready: it gets runs once it has collected
            return
        runs = collections.Counter()
        for group, queued in self.workqueue.items():
            runs[self._backend_of_group[group]] += sum(not done for done in queued.values())
        pending = {b: n * self._seconds_per_run(b) for b, n in runs.items()}  # seconds no worker has been sent
        backend = self._backend_of.get(node)
        if not pending.get(backend):
            holders = {n: b for n, b in self._backend_of.items()
                       if n is not node and n in self.nodes and not n.shutting_down}
            crowd = collections.Counter(holders.values())
            load = LOAD_RUNS * self._seconds_per_run()
            worth = [b for b in pending if pending[b] and (backend is None or pending[b] > load * crowd[b])]
            if not worth:  # what is left ends sooner on the workers that have its backend loaded
                node.shutdown()
                # Its backend's workers down to their last run get their next group now (an xdist
                # worker holds its last run until it has another or is told to end, and would never
                # ask); the others ask as their runs finish. So a backend's last groups go one at a
                # time to whichever of its workers is free first: given all at once to one worker,
                # they ran after the others had ended.
                for holder in holders:
                    self._reschedule(holder)
                return
            backend = max(worth, key=lambda b: pending[b] / (1 + crowd[b]))
            self._backend_of[node] = backend
        group = next(g for g in self.workqueue if self._backend_of_group[g] == backend)
        self.workqueue.move_to_end(group, last=False)  # xdist assigns the queue's first group
        super()._assign_work_unit(node)
