"""The conformance suite: backend x mode x exec x case, each judged against the float64 reference."""
import pytest

from kit.runner import FAIL, UNSUPPORTED, run_case


def test_conformance(conformance_run, record_conformance):
    spec, label, case, exec_ = conformance_run
    result = run_case(spec, case, exec_, label=label)
    record_conformance(result)
    if result.outcome == UNSUPPORTED:
        pytest.skip(f"unsupported: {result.message}")
    if result.outcome == FAIL:
        pytest.fail(f"[{result.failure_class}] {result.message}\nrepro: {result.repro}", pytrace=False)
