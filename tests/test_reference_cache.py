"""References kept on disk (kit.engine.reference_cache, KIT_REFERENCE_CACHE): a later build of the
same step reads its references rather than computing them; a changed or reordered input, or
another step, misses."""
import torch

from backends.torch_native import TorchNativeBackend
from kit.engine import fixture, reference_cache
from kit.engine.fixture import Store, fixtures_for
from kit.harness.capabilities import Capabilities
from kit.modes import ForwardMode
from tests.helpers import count_calls, small_case

PROFILE = Capabilities.of(TorchNativeBackend).profile


def _built(case):
    """The case's fixture as a fresh process builds it (nothing kept in memory)."""
    return fixtures_for([case], "cpu", Store(), PROFILE)[0]


def test_a_kept_reference_is_read_not_computed_and_a_changed_input_misses(tmp_path, monkeypatch):
    monkeypatch.setenv(reference_cache.ENV, str(tmp_path))
    computed = count_calls(monkeypatch, fixture, "references")
    case = small_case("kept", ForwardMode.EXTEND, prefix=(5, 9), new=(3, 2))
    first = _built(case)
    assert len(computed) == 1 and len(list(tmp_path.glob("*.pt"))) == 1
    again = _built(case)
    assert len(computed) == 1  # read, not computed
    for layer_id in range(len(first.layers)):
        for kept, made in zip(again.reference(layer_id), first.reference(layer_id)):
            assert torch.equal(kept, made) and kept.dtype == made.dtype

    step = again.steps[0]
    step.references.clear()
    step.inputs[0].q[0, 0, 0] += 1  # a changed input
    golden, _ = step.reference(0)
    assert len(computed) == 2 and not torch.equal(golden, first.reference(0)[0])
    step.references.clear()
    step.inputs[0].q[0, 0, 0] -= 1
    step.inputs[0].k_old[[0, 1]] = step.inputs[0].k_old[[1, 0]].clone()  # the same values, reordered
    step.reference(0)
    assert len(computed) == 3
    _built(small_case("other", ForwardMode.EXTEND, prefix=(5, 9), new=(3, 2), head_dim=32))  # another case
    assert len(computed) == 4 and len(list(tmp_path.glob("*.pt"))) == 4


def test_without_the_variable_every_build_computes_its_references(monkeypatch):
    monkeypatch.delenv(reference_cache.ENV, raising=False)
    computed = count_calls(monkeypatch, fixture, "references")
    case = small_case("unkept", ForwardMode.DECODE, prefix=(5, 9))
    _built(case)
    _built(case)
    assert len(computed) == 2
