"""`--dist loadgroup`: each run's group, and the scheduler that keeps a worker to one backend
(kit.plugin.worker_affinity)."""
from __future__ import annotations

from typing import Dict, Tuple

import pytest

from kit.plugin.selection import SELECTION, Selection, group_of, run_of


def groups(sel: Selection) -> Dict[str, Tuple[str, str]]:
    """Each run's (group, backend), by run id: a group is a backend's runs of one mode and kernel
    variant, so that a worker loads (JIT-builds, compiles) each kernel once, while the groups stay
    small enough to keep every worker busy. Not xdist_group marks, whose `@group` suffix pytest 9
    drops from the node ids (xdist 3.8 sets `item._nodeid`, which pytest 9 no longer reads): every
    run was a group of its own."""
    return {run.id: (group_of(run), run.label) for run in sel.runs()}


class Grouping:
    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config, log):
        """`--dist loadgroup`: each worker keeps to one backend (kit.plugin.worker_affinity)."""
        if config.getoption("dist", None) != "loadgroup":
            return None
        from kit.plugin.worker_affinity import BackendAffinityScheduling
        by_run = groups(config.stash[SELECTION])
        return BackendAffinityScheduling(config, log, lambda nodeid: by_run.get(run_of(nodeid) or ""))
