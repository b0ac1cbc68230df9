"""kit.engine.reference.attention matches a brute-force triple loop over the fixture's logical tokens."""
from __future__ import annotations

import math

import pytest
import torch


from kit.engine import reference
from kit.modes import ForwardMode
from kit.engine.pools import CASE_LAYER_ID
from kit.engine.reference import attention
from tests.helpers import make_fixture, small_case

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND
TARGET_VERIFY, DRAFT_EXTEND_V2 = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2
GQA, MQA = (4, 2), (4, 1)


def _case(name, mode, prefix, new=1, **kw):
    kw.setdefault("heads", GQA)
    return small_case(name, mode, prefix, new, **kw)


CASES = [
    _case("dec_gqa", DECODE, (0, 5, 11)),
    _case("dec_mqa_p16", DECODE, (3, 17), heads=MQA, page=16),
    _case("dec_window", DECODE, (12, 3, 5), window=4),
    _case("dec_cap_scale", DECODE, (6, 9), cap=1.5, scale=0.7),
    _case("ext_gqa_ragged", EXTEND, (0, 6, 2), (3, 1, 5)),
    _case("ext_mqa_window", EXTEND, (5, 0), (6, 8), heads=MQA, window=3),
    _case("ext_cap", EXTEND, (4,), (3,), cap=1.0, scale=0.9, layout="shuffled_pages"),
    _case("tv_chain_mqa", TARGET_VERIFY, (4, 0), 3, heads=MQA),
    _case("tv_tree_gqa", TARGET_VERIFY, (5, 2), 5, topk=2),
    _case("tv_tree_window", TARGET_VERIFY, (9,), 5, topk=2, window=3),
    _case("dev2_scale", DRAFT_EXTEND_V2, (3, 7), 3, scale=0.3),
    _case("dev2_window_cap", DRAFT_EXTEND_V2, (8,), 4, window=2, cap=2.0, heads=MQA),
]


def visible_keys(req, i, window):
    """Keys query i may see: structural visibility, then the window rule p-W <= key position <= p."""
    p = req.q_pos[i]
    keys = []
    for j in range(req.total):
        if not bool(req.visible[i, j]):
            continue
        if window >= 0 and not (p - window <= req.key_pos[j] <= p):
            continue
        keys.append(j)
    return keys


def brute_force(fx, layer_id=CASE_LAYER_ID):
    """Plain-float softmax attention, one query / head / key at a time, of one layer."""
    layer = fx.layers[layer_id]
    hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
    group = hq // hkv
    q_all = fx.inputs[layer_id].q.double().tolist()
    out = [[[0.0] * d for _ in range(hq)] for _ in range(len(q_all))]
    t = 0
    for req, (k, v) in zip(fx.plan.requests, fx.logical_kv(layer_id)):
        k, v = k.double().tolist(), v.double().tolist()
        for i in range(req.n_new):
            keys = visible_keys(req, i, layer.sliding_window_size)
            for h in range(hq):
                kh = h // group
                scores = []
                for j in keys:
                    s = 0.0
                    for x in range(d):
                        s += q_all[t][h][x] * k[j][kh][x]
                    s *= layer.scaling
                    if layer.logit_cap > 0:
                        s = layer.logit_cap * math.tanh(s / layer.logit_cap)
                    scores.append(s)
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                z = sum(w)
                for x in range(d):
                    acc = 0.0
                    for wj, j in zip(w, keys):
                        acc += wj * v[j][kh][x]
                    out[t][h][x] = acc / z
            t += 1
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_matches_brute_force(case):
    """The float64 golden equals the triple loop; the same-dtype (fp32) reference is close to it."""
    fx = make_fixture(case)
    expected = brute_force(fx)
    golden = attention(fx, torch.float64)
    assert golden.dtype == torch.float64
    assert golden.shape == (fx.plan.num_tokens, case.num_q_heads, case.head_dim)
    torch.testing.assert_close(golden, expected, rtol=1e-10, atol=1e-10)
    fp32 = attention(fx, torch.float32)
    assert fp32.dtype == torch.float32
    torch.testing.assert_close(fp32.double(), expected, rtol=1e-4, atol=1e-5)


def test_sliding_window_sees_w_plus_one_keys():
    """With window W a decode query at position p sees exactly the W+1 keys p-W..p, and the window matters."""
    case = CASES[2]  # dec_window: prefix (12, 3, 5), W = 4
    fx = make_fixture(case)
    counts = [len(visible_keys(r, 0, case.window)) for r in fx.plan.requests]
    assert counts == [5, 4, 5]  # request with 3 cached tokens has only 4 keys in all
    assert visible_keys(fx.plan.requests[0], 0, case.window) == [8, 9, 10, 11, 12]
    no_window = make_fixture(case.with_(window=-1))
    assert torch.equal(no_window.q, fx.q)  # same seed and shapes: same inputs
    assert not torch.allclose(attention(no_window), attention(fx))


def test_logit_cap_and_scale_matter():
    """Logit cap and custom sm_scale change the golden (so the cases above test them)."""
    case = CASES[3]  # dec_cap_scale
    base = attention(make_fixture(case))
    assert not torch.allclose(base, attention(make_fixture(case.with_(cap=0.0))))
    assert not torch.allclose(base, attention(make_fixture(case.with_(scale=None))))


def test_tree_query_sees_only_ancestors():
    """In a topk-2 tree a sibling's key does not reach a draft: brute force key sets follow the parents."""
    fx = make_fixture(CASES[8])  # tv_tree_gqa
    for req in fx.plan.requests:
        assert req.parents[1] == req.parents[2] == 0
        keys2 = visible_keys(req, 2, -1)
        assert req.n_old + 1 not in keys2  # draft 1 is draft 2's sibling
        assert keys2 == list(range(req.n_old)) + [req.n_old, req.n_old + 2]


def test_reference_never_reads_the_pool():
    """Wiping the pool and req_to_token does not change the reference (it reads logical token lists only)."""
    fx = make_fixture(CASES[4])
    before = attention(fx)
    for buf in fx.pools.token_to_kv_pool.k_buffer + fx.pools.token_to_kv_pool.v_buffer:
        buf.zero_()
    fx.pools.req_to_token_pool.req_to_token.zero_()
    torch.testing.assert_close(attention(fx), before, rtol=0, atol=0)


HYBRID = [_case("dec_hybrid_window", DECODE, (12, 3, 5), window=4, hybrid=True),
          _case("ext_hybrid", EXTEND, (5, 0, 9), (6, 8, 1), hybrid=True, cap=1.5)]


@pytest.mark.parametrize("case", HYBRID, ids=[c.name for c in HYBRID])
def test_every_layer_of_a_hybrid_model_has_its_own_golden(case):
    """references() computes every layer at once; a hybrid model's layers differ in window,
    scale and cap, and each layer's golden follows its own."""
    fx = make_fixture(case)
    assert fx.layers[0].sliding_window_size != fx.layers[1].sliding_window_size
    for layer in fx.layers:
        golden, same_dtype = fx.reference(layer.layer_id)
        torch.testing.assert_close(golden, brute_force(fx, layer.layer_id), rtol=1e-10, atol=1e-10)
        assert same_dtype.dtype == case.torch_dtype


def test_requests_taken_in_groups_give_the_same_golden(monkeypatch):
    """Requests are padded together in groups under CHUNK_BYTES, and a request whose scores alone
    exceed it is taken in slices of its query rows; one query row per group (the smallest budget)
    gives the same golden and same-dtype reference as all at once."""
    case = CASES[4]  # ext_gqa_ragged: 3 requests of different lengths
    fx = make_fixture(case)
    together = attention(fx)
    same_dtype = reference.attention(fx, case.torch_dtype)
    monkeypatch.setattr(reference, "CHUNK_BYTES", 1)
    groups = reference._groups(fx.plan, case.num_q_heads, case.window, "cpu")
    assert len(groups) == sum(max(r.n_new, 1) for r in fx.plan.requests) > case.bs
    torch.testing.assert_close(attention(fx), together, rtol=0, atol=1e-15)
    torch.testing.assert_close(reference.attention(fx, case.torch_dtype), same_dtype, rtol=0, atol=0)


MLA = dict(heads=(4, 1), head_dim=24, kv_lora_rank=16, rope_dim=8, scale=0.3)
MLA_CASES = [
    _case("mla_dec", DECODE, (0, 5, 11), **MLA),
    _case("mla_ext_ragged", EXTEND, (0, 6, 2), (3, 1, 5), page=16, **MLA),
    _case("mla_tv_tree", TARGET_VERIFY, (5, 2), 5, topk=2, **MLA),
    _case("mla_dev2", DRAFT_EXTEND_V2, (3, 7), 3, **MLA),
]


def brute_force_mla(fx, layer_id=CASE_LAYER_ID):
    """MLA by its definition, from the latent rows alone (never the fixture's V): a score is
    scale * (q_latent . c_kv + q_rope . k_rope), the output the softmax mix of c_kv."""
    layer = fx.layers[layer_id]
    rank, rope = layer.kv_lora_rank, layer.rope_dim
    q_all = fx.inputs[layer_id].q.double().tolist()
    out = [[[0.0] * rank for _ in range(layer.tp_q_head_num)] for _ in range(len(q_all))]
    t = 0
    for req, (latent, _) in zip(fx.plan.requests, fx.logical_kv(layer_id)):
        rows = [row[0] for row in latent.double().tolist()]  # one KV head
        for i in range(req.n_new):
            keys = visible_keys(req, i, -1)
            for h in range(layer.tp_q_head_num):
                q = q_all[t][h]
                scores = [layer.scaling * (sum(q[x] * rows[j][x] for x in range(rank))
                                           + sum(q[rank + x] * rows[j][rank + x] for x in range(rope))) for j in keys]
                w = [math.exp(s - max(scores)) for s in scores]
                for x in range(rank):
                    out[t][h][x] = sum(wj * rows[j][x] for wj, j in zip(w, keys)) / sum(w)
            t += 1
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("case", MLA_CASES, ids=[c.name for c in MLA_CASES])
def test_mla_reference_matches_brute_force(case):
    """MLA's golden is [T, Hq, kv_lora_rank] and equals the definition computed key by key."""
    fx = make_fixture(case)
    golden = attention(fx, torch.float64)
    assert golden.shape == (fx.plan.num_tokens, case.num_q_heads, case.kv_lora_rank)
    torch.testing.assert_close(golden, brute_force_mla(fx), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(attention(fx, torch.float32).double(), golden, rtol=1e-4, atol=1e-5)


def test_mla_rope_part_and_scale_matter():
    """The rope columns of q and k move the golden (a kernel dropping them is wrong), and so
    does a scale taken from the latent's head_dim."""
    fx = make_fixture(MLA_CASES[1])
    golden = attention(fx)
    x = fx.inputs[CASE_LAYER_ID]
    saved = x.q.clone()
    x.q[..., MLA["kv_lora_rank"]:] = 0
    try:
        assert not torch.allclose(attention(fx), golden)
    finally:
        x.q.copy_(saved)
    assert not torch.allclose(attention(make_fixture(MLA_CASES[1].with_(scale=MLA["head_dim"] ** -0.5))), golden)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.EXTEND], ids=lambda m: m.value)
def test_the_hybrid_models_cap_matters_in_every_row(mode):
    """The hybrid window case's other layer is capped (kit.engine.layer.HYBRID_CAP): the cap dropped moves
    every request's rows past bf16's per-head limit by a wide margin, so the verdict of a backend that
    drops it does not depend on the layout or the draw (a row with one visible key has nothing to cap)."""
    import dataclasses

    from cases import CATALOG
    from kit.harness.checks import REL_RMS
    case = next(c for c in CATALOG.cases("full", mode) if c.name == "gqa_hybrid_window_p16")
    step = make_fixture(case).step
    capped = step.layers[0]
    assert capped.logit_cap > 0 and step.layers[1].sliding_window_size >= 0
    uncapped = dataclasses.replace(step, layers=(dataclasses.replace(capped, logit_cap=0.0), step.layers[1]))
    kept, dropped = reference.golden(step, 0), reference.golden(uncapped, 0)
    rel = ((dropped - kept).pow(2).mean(-1).sqrt() / kept.pow(2).mean(-1).sqrt()).amax(dim=1)
    worst = [rows.max().item() for rows in rel.split([r.n_new for r in step.plan.requests])]
    assert min(worst) > 4 * REL_RMS[torch.bfloat16], worst
