"""Each engine's draft rule (kit.engine.drafts), named by its profile: a case line is checked only
for what its mode needs; how an engine counts its drafts decides whether its backends run the case."""
import dataclasses

import pytest

from backends.torch_native import TorchNativeBackend
from backends.vllm.adapter import PROFILE as VLLM
from cases import CATALOG
from kit.engine import drafts
from kit.engine.profile import NATIVE, SGLANG
from kit.harness.capabilities import Capabilities
from kit.harness.runner import run_case
from kit.harness.scope import declined
from kit.modes import MODES, Exec, ForwardMode
from tests.helpers import small_case

TARGET_VERIFY, DRAFT_DECODE = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_DECODE
# A chain of 3 steps verifying 2 draft tokens: neither engine counts a chain's drafts so.
CHAIN_MISCOUNTED = small_case("chain_miscounted", TARGET_VERIFY, (5, 17), 2, steps=3, page=4)
# Lanes at pages > 1: SGLang copies each request's partial last page into every lane first.
PAGED_LANES = small_case("paged_lanes", DRAFT_DECODE, (5, 17), 4, topk=2, steps=2, page=4)


class AnyDraftsTorchNative(TorchNativeBackend):
    """The in-box reference backend under an engine that runs every draft configuration."""

    name = "any_drafts_torch_native"
    profile = dataclasses.replace(NATIVE, name="any-drafts", drafts=None)


def test_a_chain_counted_otherwise_is_a_valid_line_each_engine_refuses_citing_its_own_rule():
    assert "SGLang's arg_groups/speculative_hook.py" in SGLANG.unscheduled(CHAIN_MISCOUNTED)
    assert "vLLM's v1/spec_decode/llm_base_proposer.py" in VLLM.unscheduled(CHAIN_MISCOUNTED)
    assert AnyDraftsTorchNative.profile.unscheduled(CHAIN_MISCOUNTED) is None


def test_sglang_alone_refuses_draft_lanes_at_pages_over_one():
    assert "eagle_worker_common.py" in SGLANG.unscheduled(PAGED_LANES)
    assert drafts.vllm(PAGED_LANES) is None and AnyDraftsTorchNative.profile.unscheduled(PAGED_LANES) is None
    assert SGLANG.unscheduled(dataclasses.replace(PAGED_LANES, page=1)) is None


def test_the_rule_is_the_backends_declared_reason():
    caps = Capabilities.of(TorchNativeBackend)
    found = declined(TorchNativeBackend, caps, CHAIN_MISCOUNTED, Exec.EAGER)
    assert found.declared and "leave steps out" in found.reason
    assert declined(AnyDraftsTorchNative, Capabilities.of(AnyDraftsTorchNative), CHAIN_MISCOUNTED, Exec.EAGER) is None


def test_a_case_an_engine_refuses_runs_where_the_engine_takes_it():
    r = run_case("backends.torch_native:TorchNativeBackend", CHAIN_MISCOUNTED, Exec.EAGER)
    assert r.outcome == "unsupported" and "leave steps out" in r.message, r.message
    r = run_case("tests.test_kit_drafts:AnyDraftsTorchNative", CHAIN_MISCOUNTED, Exec.EAGER)
    assert r.outcome == "pass", r.message


@pytest.mark.parametrize("rule", [drafts.sglang, drafts.vllm], ids=["sglang", "vllm"])
def test_no_catalog_case_is_refused_by_an_engines_draft_rule(rule):
    """The catalog's speculative cases are drafts both engines make: none reads unsupported for it."""
    refused = [(c.mode.value, c.name, rule(c)) for set_ in ("smoke", "full") for mode in MODES
               for c in CATALOG.cases(set_, mode) if c.mode in (TARGET_VERIFY, DRAFT_DECODE, ForwardMode.DRAFT_EXTEND_V2)
               and rule(c)]
    assert not refused, refused


def test_a_recurrent_verify_is_no_draft_shape_a_rule_refuses():
    """A recurrent case verifies a chain of its `new` drafts: no topk or steps for a rule to read."""
    verify = next(c for c in CATALOG.matrix_cases("smoke", TARGET_VERIFY) if not hasattr(c, "topk"))
    assert SGLANG.unscheduled(verify) is None and VLLM.unscheduled(verify) is None


def test_a_profile_whose_drafts_are_not_a_rule_is_malformed():
    assert "drafts must be None or a function" in dataclasses.replace(SGLANG, drafts="sglang").problem()
    assert SGLANG.problem() is None and VLLM.problem() is None
