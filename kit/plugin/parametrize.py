"""One test per run (`conformance_run`, a kit.harness.run.Run), a run that KNOWN_FAILURES.md
lists marked as a strict expected failure."""
from __future__ import annotations

import dataclasses

import pytest

from kit.harness.environment import device_name
from kit.plugin.selection import SELECTION
from kit.report import known_failures


class KnownFailureHit(Exception):
    """Raised when a run fails exactly as its KNOWN_FAILURES entry says (the only xfail that counts)."""


class Parametrize:
    def pytest_generate_tests(self, metafunc):
        """One test per run of Selection.runs (the product, or a shard's part of it), in its order.
        Under `--dist loadgroup` the runs of a group (kit.plugin.grouping) go to one worker."""
        if "conformance_run" not in metafunc.fixturenames:
            return
        sel = metafunc.config.stash[SELECTION]
        device = device_name()
        params, known = [], {}
        for run in sel.runs():
            if run.label not in known:
                known[run.label] = known_failures.of_backend(sel.known, run.label, device)
            entry = known_failures.match(known[run.label], run.label, run.case.mode.value, run.exec_.value,
                                         run.case.name, device, run.case.dtype)
            marks = [] if entry is None else [pytest.mark.xfail(
                strict=True, raises=KnownFailureHit,
                reason=f"{entry.id} expects {entry.expects}: {entry.reason} ({entry.where})")]
            params.append(pytest.param(dataclasses.replace(run, known=entry), marks=marks, id=run.id))
        metafunc.parametrize("conformance_run", params)
