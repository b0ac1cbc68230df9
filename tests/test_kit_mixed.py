"""MIXED batches: extend rows then decode rows, as SGLang's mixed chunked prefill hands them to a
backend eagerly, and replayed on the token-bucket graphs an EXTEND batch captured, handed as EXTEND
(SGLang's prefill graph runner rewrites the mode)."""
from __future__ import annotations

import re

import pytest

from backends.torch_native import TorchNativeBackend
from kit.engine.case import Case
from kit.engine.modes import rules_for
from kit.engine.modes.mixed import decode_rows
from kit.engine.profile import SGLANG
from kit.harness.graph import harness_for
from kit.modes import Exec, ForwardMode
from tests.helpers import make_fixture, run_setup, small_case

MIXED, EXTEND = ForwardMode.MIXED, ForwardMode.EXTEND
CASE = small_case("mixed_probe", MIXED, (0, 17, 40), (9, 1, 1), page=16)


@pytest.mark.parametrize("new, rows", [((9, 1, 1), 2), ((9, 3), 0), ((1, 1, 1), 2), ((4, 1, 2, 1), 1)])
def test_decode_rows_are_the_trailing_one_token_rows_after_the_first(new, rows):
    assert decode_rows(new) == rows


@pytest.mark.parametrize("fields, message", [
    (dict(prefix=(3, 4), new=(2, 5)), "at least one extend row, then at least one decode row"),
    (dict(prefix=(3, 0), new=(2, 1)), "a MIXED decode row (the trailing new=1 rows) has a prefix >= 1"),
    (dict(prefix=(3, 4), new=5), "needs `new` as one extend length >= 1 per request"),
    (dict(prefix=(3, 4), new=(2, 1), steps=2), "then at least one decode row (new=3) last"),
    (dict(prefix=(3, 4), new=(2, 3), steps=2, topk=2), "verifies a chain of drafts (topk 1)"),
])
def test_a_mixed_case_has_extend_rows_then_decode_rows(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Case("bad", MIXED, **fields)


def test_decode_rows_verifying_drafts_are_the_trailing_rows_of_one_plus_steps_tokens():
    """vLLM's speculative decoding beside chunked prefill: every batch of a run keeps its decode rows at
    1 + steps tokens (the graphs' buckets scaled to them), and the backend is built with the drafts."""
    case = small_case("mixed_spec", MIXED, (0, 17, 40), (9, 3, 3), page=16, steps=2)
    rules = rules_for(MIXED)
    assert decode_rows((9, 3, 3), 3) == 2 and rules.decode_rows(case) == 2 and rules.decode_tokens(case) == 3
    spec = rules.speculative_config(case)
    assert (spec.num_draft_tokens, spec.topk, spec.num_steps) == (3, 1, 2)
    assert rules.speculative_config(CASE) is None
    for batch in rules.eager_sequence(case) + rules.replay_schedule(case, SGLANG):
        if batch.mode is MIXED:
            assert batch.steps == 2 and rules.decode_rows(batch) >= 1, batch
        else:
            assert batch.steps is None, batch


def test_a_mixed_batch_carries_every_rows_prefix_and_new_tokens():
    """extend_* fields for every row in order, a decode row's prefix its seq_len - 1."""
    b = make_fixture(CASE).batch
    assert b.forward_mode is MIXED
    assert b.extend_prefix_lens.tolist() == b.extend_prefix_lens_cpu == [0, 17, 40]
    assert b.extend_seq_lens.tolist() == [9, 1, 1] and b.seq_lens.tolist() == [9, 18, 41]
    assert b.extend_start_loc.tolist() == [0, 9, 10] and b.extend_num_tokens == b.num_tokens == 11
    assert b.positions.tolist() == list(range(9)) + [17, 40]


def test_every_batch_of_a_run_is_a_mixed_one_but_the_extend_that_captures_and_the_request_alone():
    """A graph run's first token bucket is captured by an EXTEND batch; the case's recurring request alone
    (kit.engine.variants.alone) is an EXTEND batch of one request, eager and replayed."""
    for exec_ in (Exec.EAGER, Exec.GRAPH):
        for case in (CASE, small_case("ones", MIXED, (0, 1, 5), (1, 1, 1)), small_case("two", MIXED, (7, 3), (5, 1))):
            batches = [b for b in (rules_for(MIXED).eager_sequence(case) if exec_ is Exec.EAGER else
                                   rules_for(MIXED).replay_schedule(case, SGLANG))]
            assert all(decode_rows(b.new) >= 1 for b in batches if b.mode is MIXED)
            extend = [b for b in batches if b.mode is EXTEND]
            assert len(extend) == (2 if exec_ is Exec.GRAPH else 1)
            assert [b.bs for b in extend][-1] == 1


class ModeRecorder(TorchNativeBackend):
    """torch_native with graph hooks that record the mode each hook is handed."""

    extend_capture = True
    seen = []

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        pass

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        self.seen.append(("capture" if in_capture else "replay", batch.forward_mode, batch.batch_size))
        self.init_forward_metadata(batch)


def test_graphs_replay_a_mixed_batch_as_extend_on_the_graph_an_extend_batch_captured():
    ModeRecorder.seen.clear()
    setup = run_setup(CASE, Exec.GRAPH, "cpu", ModeRecorder)
    fixtures = setup.fixtures
    harness = harness_for(setup.new_backend(), fixtures)
    harness.capture()
    for fx in fixtures:
        harness.prepare(fx)
        harness.replay(fx)
    seen = ModeRecorder.seen
    assert {mode for _, mode, _ in seen} == {EXTEND}
    # the first bucket is captured with the EXTEND batch, then replayed with a MIXED one of another row count
    assert fixtures[0].case.mode is EXTEND and fixtures[1].case.mode is MIXED
    assert seen[:3] == [("capture", EXTEND, fixtures[0].batch.batch_size), ("replay", EXTEND, 2),
                        ("replay", EXTEND, fixtures[1].batch.batch_size)]
    eager = run_setup(CASE, Exec.EAGER, "cpu", TorchNativeBackend).fixtures
    assert all(fx.batch.forward_mode is MIXED for fx in eager[:-1]) and eager[-1].batch.forward_mode is EXTEND
