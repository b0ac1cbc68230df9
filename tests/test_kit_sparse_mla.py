"""Sparse MLA as an attention kind: the index sets the kit draws (within each query's view, no
duplicates, -1 padded, page edges, k past a context), the reference over the selected keys alone,
the strided-block storage, the in-box backend on every smoke case, and its mutants caught."""
from __future__ import annotations

import pytest
import torch

from kit.engine.case import Case
from kit.engine.catalog import load_catalog
from kit.engine.kinds import KINDS
from kit.engine.plan import plan_case
from kit.engine.reference import golden
from kit.engine.sparse import PAD
from kit.engine.storage import flat, storage
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from kit.report.record import PASS
from tests.helpers import make_fixture

SPARSE = dict(heads=(4, 1), head_dim=24, kv_lora_rank=16, rope_dim=8, scale=0.3, index_topk=6, dtype="fp32")
BACKEND = "backends.torch_sparse_mla:TorchSparseMLABackend"
SPARSE_MODES = (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)


def _case(mode=ForwardMode.EXTEND, prefix=(0, 3, 40), new=None, page=4, **kw):
    """A small sparse case of `mode`; `new` by default: ragged extends (MIXED's last a decode row),
    three drafts, one decode token."""
    default = {ForwardMode.EXTEND: (5, 9, 4)[:len(prefix)], ForwardMode.MIXED: (5, 9, 1)[-len(prefix):],
               ForwardMode.TARGET_VERIFY: 3, ForwardMode.DECODE: 1}[mode]
    return Case("smla", mode, prefix=prefix, new=default if new is None else new, page=page, **dict(SPARSE, **kw))


@pytest.mark.parametrize("scatter", [False, True], ids=["tail", "scattered"])
@pytest.mark.parametrize("mode", SPARSE_MODES, ids=lambda m: m.value)
def test_each_row_selects_distinct_keys_the_query_sees_padded_with_minus_one(mode, scatter):
    case = _case(mode, index_scatter=scatter)
    padded_among = False
    for r in plan_case(case).requests:
        assert len(r.selected) == r.n_new
        for row, seen in zip(r.selected.tolist(), r.visible.tolist()):
            keys = [j for j in row if j != PAD]
            visible = [j for j, on in enumerate(seen) if on]
            assert len(row) == case.index_topk and len(set(keys)) == len(keys)
            assert set(keys) <= set(visible), "an index outside the query's view"
            assert len(keys) == min(case.index_topk, len(visible))  # every key where k is past the context
            if not scatter:
                assert row[len(keys):] == [PAD] * (len(row) - len(keys))
            padded_among |= PAD in row[:len(keys)]
    assert padded_among == scatter


def test_page_edges_are_selected_first():
    """Past k keys, at least half the row is keys at a page's first or last token (where an index
    read through the wrong page shows), as many as there are."""
    case = _case(ForwardMode.DECODE, prefix=(200,), page=16, index_topk=8)
    row = plan_case(case).requests[0].selected[0].tolist()
    assert sum(j % 16 in (0, 15) for j in row) >= 4


def test_a_request_selects_the_same_keys_in_any_batch():
    alone = _case(ForwardMode.DECODE, prefix=(40,), request_seeds=(7,))
    batched = _case(ForwardMode.DECODE, prefix=(3, 40), request_seeds=(1, 7))
    assert torch.equal(plan_case(alone).requests[0].selected, plan_case(batched).requests[1].selected)


def test_batch_hands_the_rows_in_token_order():
    case = _case()
    fx = make_fixture(case)
    rows = [row for r in fx.plan.requests for row in r.selected.tolist()]
    assert fx.batch.topk_indices.dtype == torch.int32
    assert fx.batch.topk_indices.tolist() == rows and len(rows) == fx.batch.num_tokens


@pytest.mark.parametrize("mode", SPARSE_MODES, ids=lambda m: m.value)
def test_reference_attends_the_selected_keys_alone(mode):
    """The golden against attention written out per query: softmax over the selected latent rows."""
    case = _case(mode)
    fx = make_fixture(case)
    step = fx.step
    x, layer = step.inputs[1], step.layers[1]
    got = golden(step, 1)
    t = 0
    for r, (k, _) in zip(step.plan.requests, step.logical_kv(1)):
        for row in r.selected.tolist():
            keys = k[[j for j in row if j != PAD], 0].double()
            scores = keys @ x.q[t].double().T * layer.scaling  # [keys, heads]
            want = scores.softmax(0).T @ keys[:, :case.kv_lora_rank]
            torch.testing.assert_close(got[t], want, rtol=1e-12, atol=1e-12)
            t += 1
    dense = golden(dataclass_replace_selected(step), 1)
    assert not torch.allclose(dense, got), "the selection changes nothing: no case tests it"


def dataclass_replace_selected(step):
    """The step with every request attending all it sees (dense MLA)."""
    import copy
    dense = copy.copy(step)
    dense.plan = copy.copy(step.plan)
    dense.plan.requests = [copy.copy(r) for r in step.plan.requests]
    for r in dense.plan.requests:
        r.selected = None
    return dense


def test_strided_blocks_hold_a_gap_after_each_block():
    s = storage("latent_strided_blocks")
    g = KINDS["sparse_mla"].geometry(_case())
    t = torch.zeros(s.shape(3, 4, g))
    k = s.k_view(t, 3, 4, g)
    assert k.shape == (3, 4, 1, 24) and k.stride()[0] == 5 * 24
    assert flat(k) is None  # no flat view: a reader must take the block stride


@pytest.mark.parametrize("bad, message", [
    (dict(index_topk=-1), "index_topk applies to sparse MLA"),
    (dict(index_scatter=1), "index_scatter 1 must be True or False"),
    (dict(kv_lora_rank=0, rope_dim=0, head_dim=24), "sparse MLA is latent attention"),
    (dict(topk=2), "sparse MLA verifies chains"),
])
def test_case_rejects_bad_sparse_lines(bad, message):
    with pytest.raises(ValueError, match=message):
        Case("bad", ForwardMode.TARGET_VERIFY, prefix=(3, 4), new=3, **dict(SPARSE, **bad))


def test_draft_modes_refuse_sparse_cases():
    with pytest.raises(ValueError, match="sparse MLA runs in decode, extend, mixed, target_verify"):
        Case("bad", ForwardMode.DRAFT_EXTEND_V2, prefix=(3, 4), new=3, **SPARSE)


SMOKE = [(mode, c) for mode in SPARSE_MODES for c in load_catalog(None).cases("smoke", mode) if c.kind == "sparse_mla"]


@pytest.mark.parametrize("exec_", list(Exec), ids=lambda e: e.value)
@pytest.mark.parametrize("case", [c for _, c in SMOKE], ids=lambda c: f"{c.mode.value}-{c.name}")
def test_in_box_backend_passes_every_sparse_smoke_case(case, exec_):
    """Eager, and under graphs (emulated on CPU): the indexer's rows in a static buffer, padded tokens'
    rows without an index."""
    r = run_case(BACKEND, case, exec_)
    assert r.outcome == PASS, r.message
