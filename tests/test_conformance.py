"""The conformance suite: backend x mode x exec x case, each judged against the float64 reference."""
import pytest

from kit.harness.isolate import dispatch
from kit.plugin.parametrize import KnownFailureHit
from kit.plugin.timeouts import run_timeout
from kit.report.known_failures import against, is_expected
from kit.report.record import ERROR, FAIL, UNSUPPORTED


def test_conformance(conformance_run, record_conformance, request):
    known = conformance_run.known
    timeout = run_timeout(request.node)
    result = dispatch(conformance_run, timeout=timeout)
    record_conformance(result)
    if result.outcome == UNSUPPORTED:
        pytest.skip(f"unsupported: {result.message}")
    if result.outcome == ERROR:  # no verdict: the run is not done, and no known failure covers it
        pytest.fail(f"[{result.failure_class}] {result.message}\nrepro: {result.repro}", pytrace=False)
    if result.outcome != FAIL:
        return  # a known failure that passes is reported by its strict xfail mark
    failure = "\n".join(filter(None, (against(known, result),
                                      f"[{result.failure_class}] {result.message}", f"repro: {result.repro}")))
    if is_expected(known, result):
        raise KnownFailureHit(failure)
    pytest.fail(failure, pytrace=False)
