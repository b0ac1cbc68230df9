"""A run's time limit: pytest-timeout's, applied by the kit itself to a conformance run."""
from __future__ import annotations

import os
from argparse import ArgumentTypeError
from typing import Optional

import pytest

from kit.cli import seconds
from kit.harness.timeout import DEFAULT_S
from kit.plugin.selection import run_of

RUN_TIMEOUT = pytest.StashKey[float]()


def default_timeout(config) -> None:
    """pytest-timeout's limit is kit.harness.timeout.DEFAULT_S unless --timeout, PYTEST_TIMEOUT or
    the `timeout` ini value say otherwise (0: none): a hung backend must not hang the run. A
    negative limit is a usage error: pytest-timeout takes it for none, and a hung run would hang."""
    try:
        ini = config.getini("timeout")
    except ValueError:  # pytest-timeout disabled (-p no:timeout)
        return
    for where, value in (("--timeout", config.getoption("timeout", None)),
                         ("PYTEST_TIMEOUT", os.environ.get("PYTEST_TIMEOUT")), ("the ini's timeout", ini)):
        if value not in (None, ""):
            try:
                seconds(f"{value:g}" if isinstance(value, float) else str(value))
            except (ValueError, ArgumentTypeError) as exc:
                raise pytest.UsageError(f"{where}: {exc} (0: no limit)") from None
            return
    config.option.timeout = DEFAULT_S


class RunTimeouts:
    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_timeout_set_timer(self, item, settings):
        """A conformance run applies the limit itself (kit.harness.timeout, in the runner), so that a
        run past it is recorded as a crash at its stage and the session goes on; other tests keep
        pytest-timeout's."""
        if run_of(item.nodeid) is None:
            return None
        item.stash[RUN_TIMEOUT] = settings.timeout
        return True


def run_timeout(item) -> Optional[float]:
    """The time limit of a conformance run, in seconds (None: none)."""
    return item.stash.get(RUN_TIMEOUT, None)
