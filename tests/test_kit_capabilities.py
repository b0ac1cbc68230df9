"""A backend's declarations are read once into a checked Capabilities record: a malformed one is
the backend's crash when it loads, named, never a silent default."""
import pytest

from backends.torch_native import TorchNativeBackend
from kit.engine.profile import TWO_PHASE
from kit.harness.capabilities import BadDeclaration, Capabilities
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from kit.report.record import CRASH, FAIL
from tests.helpers import small_case


class _CaptureSaysYes(TorchNativeBackend):
    extend_capture = "yes"


class _ModesOneString(TorchNativeBackend):
    modes = "decode"


class _CiCasesAList(TorchNativeBackend):
    ci_cases = ["mqa_p1_shuf"]


class _KvDtypesTorchs(TorchNativeBackend):
    kv_dtypes = ("float8_e4m3fn",)


class _InvariantSaysYes(TorchNativeBackend):
    batch_invariant = "yes"


class _MirrorsMisnamed(TorchNativeBackend):
    host_mirrors = ("seq_lens",)


class _OwnProcessSaysYes(TorchNativeBackend):
    own_process = True  # a reason is asked for


class _NoProfile:
    """A backend that says nothing of its engine's conventions: none is assumed for it."""

    @classmethod
    def supports(cls, case):
        return None


class _ProfileAName(TorchNativeBackend):
    profile = "sglang"


@pytest.mark.parametrize("cls, named", [(_CaptureSaysYes, "extend_capture"), (_ModesOneString, "modes"),
                                        (_CiCasesAList, "ci_cases"), (_KvDtypesTorchs, "kv_dtypes"),
                                        (_InvariantSaysYes, "batch_invariant"), (_MirrorsMisnamed, "host_mirrors"),
                                        (_ProfileAName, "profile"), (_OwnProcessSaysYes, "own_process")])
def test_a_malformed_declaration_is_a_crash_when_the_backend_loads(cls, named):
    with pytest.raises(BadDeclaration, match=f"{cls.__name__}.{named} must"):
        Capabilities.of(cls)
    r = run_case(f"tests.test_kit_capabilities:{cls.__name__}", small_case("tiny", ForwardMode.DECODE, prefix=(3, 5)), Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH), r
    assert r.message.startswith(f"loading backend: BadDeclaration: {cls.__name__}.{named} must"), r.message


def test_a_backend_without_a_profile_is_a_crash_naming_the_fix():
    """No engine's conventions are assumed: a backend that declares no `profile` fails to load,
    in one line that says what to set."""
    with pytest.raises(BadDeclaration, match=r"_NoProfile declares no `profile`: set `profile = kit.engine.profile.SGLANG`"):
        Capabilities.of(_NoProfile)
    r = run_case("tests.test_kit_capabilities:_NoProfile", small_case("tiny", ForwardMode.DECODE, prefix=(3, 5)), Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, CRASH), r
    assert r.message.startswith("loading backend: BadDeclaration: _NoProfile declares no `profile`"), r.message


def test_declarations_as_read():
    caps = Capabilities.of(TorchNativeBackend)
    assert caps.hook_style is None and not caps.has_graph_hooks and caps.modes == {m.value for m in ForwardMode}
    assert caps.mode_reason(ForwardMode.DECODE) is None

    class Undeclared(TorchNativeBackend):
        modes = None
    # Modes added since the protocol began are run only by a backend that names them.
    caps = Capabilities.of(Undeclared)
    assert caps.mode_reason(ForwardMode.DECODE) is None and caps.mode_reason(ForwardMode.TARGET_VERIFY) is None
    assert "does not implement mode mixed" in caps.mode_reason(ForwardMode.MIXED)
    assert "does not implement mode draft_decode" in caps.mode_reason(ForwardMode.DRAFT_DECODE)

    class Two(TorchNativeBackend):
        modes = (ForwardMode.DECODE, "some_future_mode")
        real_rows_only = True

        def init_cuda_graph_state(self, max_bs, max_num_tokens): ...

        def init_forward_metadata_out_graph(self, batch, in_capture=False): ...
    caps = Capabilities.of(Two)
    assert caps.modes == {"decode", "some_future_mode"} and caps.real_rows_only and not caps.in_graph
    assert caps.hook_style == TWO_PHASE
    assert "does not implement mode extend" in caps.mode_reason(ForwardMode.EXTEND)


def test_a_kv_dtype_left_out_is_unsupported():
    """A backend runs an fp8 KV case only if its kv_dtypes list the case's kv_dtype."""
    case = small_case("tiny_fp8", ForwardMode.DECODE, prefix=(3, 5), kv_dtype="fp8_e5m2")

    class E4m3Only(TorchNativeBackend):
        kv_dtypes = ("fp8_e4m3",)
    assert "kv_dtypes" in Capabilities.of(E4m3Only).kv_dtype_reason(case)
    assert Capabilities.of(TorchNativeBackend).kv_dtype_reason(case) is None
    assert Capabilities.of(E4m3Only).kv_dtype_reason(case.with_(kv_dtype=None)) is None


def test_the_declarations_are_one_list_documented_once():
    """kit.harness.protocol.DECLARATIONS is every declaration: AttentionBackend documents and defaults
    exactly those (profile without a default), Capabilities holds them (besides what it finds of the
    graph hooks), and docs/extending.md's sketch of a backend names each."""
    import dataclasses
    from pathlib import Path

    from kit.harness.protocol import DECLARATIONS, AttentionBackend
    documented = set(AttentionBackend.__annotations__) - {"name"}
    assert documented == set(DECLARATIONS) and not hasattr(AttentionBackend, "profile")
    held = {f.name for f in dataclasses.fields(Capabilities)} - {"hook_style", "in_graph"}
    assert held == set(DECLARATIONS)
    sketch = (Path(__file__).resolve().parent.parent / "docs" / "extending.md").read_text().split("```python")[1]
    assert [d for d in DECLARATIONS if f"    {d} = " not in sketch] == []
