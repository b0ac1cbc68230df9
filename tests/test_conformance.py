"""The conformance suite: backend x mode x exec x case, each judged against the float64 reference."""
import pytest

from kit.harness.isolate import run_isolated
from kit.report.known_failures import QUARANTINE, is_expected
from kit.plugin.pytest_plugin import KnownFailureHit, run_timeout
from kit.report.record import ERROR, FAIL, UNSUPPORTED
from kit.harness.runner import run_case


def test_conformance(conformance_run, record_conformance, request):
    spec, label, case, exec_, known, catalog = conformance_run
    timeout = run_timeout(request.node)
    if known is not None and known.mark == QUARANTINE:
        result = run_isolated(spec, case, exec_, label, catalog, timeout=timeout)
    else:
        result = run_case(spec, case, exec_, label=label, catalog=catalog, timeout=timeout)
    record_conformance(result)
    if result.outcome == UNSUPPORTED:
        pytest.skip(f"unsupported: {result.message}")
    if result.outcome == ERROR:  # no verdict: the run is not done, and no known failure covers it
        pytest.fail(f"[{result.failure_class}] {result.message}\nrepro: {result.repro}", pytrace=False)
    if result.outcome != FAIL:
        return  # a known failure that passes is reported by its strict xfail mark
    failure = f"[{result.failure_class}] {result.message}\nrepro: {result.repro}"
    if is_expected(known, result.outcome, result.failure_class):
        raise KnownFailureHit(f"{known.id}: {failure}")
    if known is not None:
        failure = f"{known.id} expects [{known.failure_class}], got {failure}"
    pytest.fail(failure, pytrace=False)
