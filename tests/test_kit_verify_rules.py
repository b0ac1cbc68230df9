"""A recurrent verify is judged by the engine's rule, its profile's (kit.harness.recurrent_rules):
vLLM's per-token state blocks read back by num_accepted_tokens (a toy of it, tests/toys/per_token_blocks.py,
passes; the same toy reading the wrong block fails, in the verify and in the step after it), and
SGLang's rule fails under vLLM's."""
from __future__ import annotations

import dataclasses

import pytest

from backends.torch_native_linear import TorchNativeLinearBackend
from cases.linear import SMOKE
from kit.engine.profile import PER_TOKEN_BLOCKS
from kit.harness.recurrent import run_case
from kit.modes import ForwardMode
from kit.report.record import KV_WRITE
from tests.toys.per_token_blocks import OneBlockPast, PerTokenBlocksLinear, ReadsFirstBlock

VERIFY = next(c for c in SMOKE if c.name == "gdn_verify_fp32")


def test_sglangs_rule_judged_by_vllms_fails():
    """torch_native_linear keeps drafts in the intermediate pools, which vLLM's engine has none of."""
    under_vllm = type("TorchNativeLinearUnderVllmRule", (TorchNativeLinearBackend,),
                      {"profile": dataclasses.replace(TorchNativeLinearBackend.profile, recurrent_verify=PER_TOKEN_BLOCKS)})
    verdict = run_case(under_vllm, VERIFY)[0]
    assert not verdict.ok, verdict.text


def test_steps_without_drafts_keep_one_block_under_vllms_rule():
    case = next(c for c in SMOKE if c.mode == ForwardMode.DECODE and c.kind == "gdn")
    assert all(v.ok for v in run_case(PerTokenBlocksLinear, case))



class DraftsAtSlot(TorchNativeLinearBackend):
    """SGLang's verify with each request's drafts at the intermediate row of its state slot, not of its
    batch position."""

    def _draft_rows(self):
        return self.slots[self.real]

    def _write(self, layer_id, seq, states):
        if not self.verify:
            return super()._write(layer_id, seq, states)
        rows, width = self._draft_rows(), seq.shape[2] - max(self.lens) + 1
        for j in range(max(self.lens)):
            self.pool.intermediate_ssm(layer_id)[rows, j] = states[j][self.real]
            window = seq[self.real, :, j + 1:j + width]
            self.pool.intermediate_conv(layer_id)[rows, j] = window.to(self.pool.conv(layer_id).dtype)


class DraftsOneRowPast(DraftsAtSlot):
    """SGLang's verify with request i's drafts at intermediate row i + 1."""

    def _draft_rows(self):
        return self.real + 1


@pytest.mark.parametrize("backend", [PerTokenBlocksLinear, TorchNativeLinearBackend], ids=lambda c: c.__name__)
def test_a_backend_of_its_engines_rule_passes_a_verify_and_the_step_after(backend):
    """vLLM's rule (the toy) and SGLang's (torch_native_linear: drafts at the request's batch position)."""
    verdicts = run_case(backend, VERIFY)
    assert [v.ok for v in verdicts] == [True, True], [v.text for v in verdicts]


# A planted misreading of the rule: what the verify's check names.
PLANTED = {ReadsFirstBlock: "state pools wrong", OneBlockPast: "state pools wrong",
           DraftsAtSlot: "intermediate_conv layer 0 row 0 draft 0", DraftsOneRowPast: "intermediate_conv layer 0 row 0 draft 0"}


@pytest.mark.parametrize("planted", list(PLANTED), ids=lambda c: c.__name__)
def test_states_kept_elsewhere_than_the_rule_says_fail(planted):
    """vLLM's: reading another block than num_accepted_tokens says; SGLang's: drafts at another
    intermediate row than the request's batch position."""
    verdicts = run_case(planted, VERIFY)
    assert [v.ok for v in verdicts] == [False, False], [v.text for v in verdicts]
    assert all(v.failure_class == KV_WRITE for v in verdicts)
    assert PLANTED[planted] in verdicts[0].text and "the decode after the verify" in verdicts[1].step
