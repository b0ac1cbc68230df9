"""A passing run prints no numpy warnings from Triton's interpreter about masked lanes, while
the same kernel outside a run does warn (the filter is the run's, and narrow)."""
import warnings

import pytest
import torch

from cases import CATALOG as catalog
from kit.modes import Exec, ForwardMode
from kit.report.record import PASS
from kit.harness.runner import run_case

CASE = catalog.find_case(ForwardMode.DECODE, "mqa_p1_shuf")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs without CUDA")


def _interpreter_warnings(caught):
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and "interpreter" in w.filename]


def test_the_toy_kernel_warns_outside_a_run():
    from tests.toys.noisy_interpreter import masked_softmax_row

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert masked_softmax_row(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]
    assert _interpreter_warnings(caught), [str(w.message) for w in caught]


def test_a_passing_run_prints_no_interpreter_noise():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run_case("tests.toys.noisy_interpreter:NoisyInterpreterBackend", CASE, Exec.EAGER)
    assert r.outcome == PASS, r.message
    assert not _interpreter_warnings(caught), [str(w.message) for w in _interpreter_warnings(caught)]


def test_other_runtime_warnings_still_show():
    def warns(*args, **kwargs):
        warnings.warn("a backend's own warning", RuntimeWarning)

    from kit.harness.interpreter_noise import interpreter_noise_filtered

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with interpreter_noise_filtered():
            warns()
    assert [str(w.message) for w in caught] == ["a backend's own warning"]
