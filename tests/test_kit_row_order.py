"""A ragged step's rows in the order the engine's profile hands them (kit.engine.profile.ROW_ORDERS,
kit.engine.plan.row_order): SGLang's as scheduled, vLLM's decode rows first as its runner reorders
them. The same requests (data, pages, pool rows) in another order, judged against the same reference."""
import dataclasses

import pytest

from backends.torch_native import TorchNativeBackend
from backends.vllm.adapter import PROFILE as VLLM
from cases import CATALOG
from kit.engine.case import Case
from kit.engine.fixture import fixtures_for
from kit.process.memory import STORE
from kit.engine.plan import plan_case, row_order
from kit.engine.profile import AS_SCHEDULED, DECODE_FIRST, SGLANG
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode

MIXED, EXTEND = ForwardMode.MIXED, ForwardMode.EXTEND
DECODE_FIRST_PROFILE = dataclasses.replace(TorchNativeBackend.profile, name="decode-first", row_order=DECODE_FIRST)


class DecodeFirstTorchNative(TorchNativeBackend):
    """The in-box reference backend, handed its steps decode rows first."""

    profile = DECODE_FIRST_PROFILE


class SpecBesidePrefillTorchNative(TorchNativeBackend):
    """The in-box reference backend under an engine that schedules verifying decode rows beside prefill."""

    profile = dataclasses.replace(DECODE_FIRST_PROFILE, spec_rows_beside_prefill=True)


class ExtendRowsFirst(DecodeFirstTorchNative):
    """Takes a MIXED step's first row for the chunk's fresh prompt, as a backend written for SGLang's
    order may: that row attends no cached key."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if batch.forward_mode is MIXED:
            first, *rest = batch.step.requests
            fresh = dataclasses.replace(first, n_old=0, keys=first.key_tokens[first.n_old:],
                                        visible=first.visible[:, first.n_old:])
            batch = dataclasses.replace(batch, step=dataclasses.replace(batch.step, requests=[fresh] + rest))
        return super().forward(q, k, v, layer, batch, save_kv_cache)


def test_decode_first_is_vllms_region_order():
    """Decode rows, then one-token rows with a cached prefix, then longer ones, then fresh prompts,
    each region as listed (reorder_batch_to_split_decodes_and_prefills)."""
    mixed = CATALOG.find_case(MIXED, "gqa_bs9_cap_p1_nonmono")  # new (5, 1, 3, 1, ...): row 1 a one-token extend
    assert row_order(mixed, DECODE_FIRST) == [3, 4, 5, 6, 7, 8, 1, 0, 2]
    assert row_order(mixed, AS_SCHEDULED) == list(range(9))
    fresh = Case("fresh", mode=EXTEND, prefix=(0, 7, 3, 0), new=(4, 1, 9, 2))
    assert row_order(fresh, DECODE_FIRST) == [1, 2, 0, 3]
    decode = CATALOG.find_case(ForwardMode.DECODE, "gqa_ragged_p16_fp32")  # prefix 0 first: not ragged, kept
    assert row_order(decode, DECODE_FIRST) == list(range(decode.bs))


def test_the_same_requests_in_another_order():
    case = CATALOG.find_case(MIXED, "gqa_fresh_prompt_p16_fp32")  # prefix (0, 40, 17), new (20, 1, 1)
    listed, first = plan_case(case), plan_case(case, DECODE_FIRST)
    assert [r.request for r in first.requests] == [1, 2, 0]
    by_request = {r.request: r for r in listed.requests}
    for r in first.requests:
        assert (r.row, r.slots, r.n_old, r.n_new) == (by_request[r.request].row, by_request[r.request].slots,
                                                       by_request[r.request].n_old, by_request[r.request].n_new)
    fx = fixtures_for([case], "cpu", STORE, DECODE_FIRST_PROFILE)[0]
    assert fx.batch.extend_seq_lens.tolist() == [1, 1, 20]
    assert fx.batch.extend_prefix_lens.tolist() == [40, 17, 0]


@pytest.mark.parametrize("mode, name", [(MIXED, "gqa_bs9_cap_p1_nonmono"), (EXTEND, "gqa_ragged_p16_fp32")])
def test_a_backend_passes_decode_first(mode, name):
    r = run_case("tests.test_kit_row_order:DecodeFirstTorchNative", CATALOG.find_case(mode, name), Exec.EAGER)
    assert r.outcome == "pass", r.message


def test_a_backend_that_takes_the_first_row_for_an_extend_row_is_caught_decode_first():
    case = CATALOG.find_case(MIXED, "gqa_fresh_prompt_p16_fp32")
    assert plan_case(case).requests[0].n_old == 0  # as scheduled the first row is the fresh prompt: right
    r = run_case("tests.test_kit_row_order:ExtendRowsFirst", case, Exec.EAGER)
    assert r.outcome == "fail", r.message


def test_vllm_hands_decode_rows_first_and_verifying_rows_beside_prefill_and_sglang_neither():
    assert (VLLM.row_order, VLLM.spec_rows_beside_prefill) == (DECODE_FIRST, True)
    assert (SGLANG.row_order, SGLANG.spec_rows_beside_prefill) == (AS_SCHEDULED, False)


def test_verifying_rows_beside_prefill_run_where_the_engine_schedules_them():
    case = CATALOG.find_case(MIXED, "gqa_spec2_beside_prefill_p16_fp32")  # new (20, 5, 3, 3), steps 2
    assert row_order(case, DECODE_FIRST) == [2, 3, 1, 0]
    r = run_case("backends.torch_native:TorchNativeBackend", case, Exec.EAGER)
    assert r.outcome == "unsupported" and "spec_rows_beside_prefill" in r.message, r.message
    r = run_case("tests.test_kit_row_order:SpecBesidePrefillTorchNative", case, Exec.EAGER)
    assert r.outcome == "pass", r.message
