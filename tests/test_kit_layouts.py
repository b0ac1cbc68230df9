"""Layouts place pages as their names say, keep the paged invariant, and leave poison around."""
from __future__ import annotations

import random

import pytest
import torch

from kit.engine.case import LAYOUTS
from kit.engine.layouts import place_pages, slots_of
from kit.modes import ForwardMode
from kit.engine.plan import plan_case
from kit.engine.pools import CASE_LAYER_ID
from tests.helpers import make_fixture, small_case

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND
TARGET_VERIFY, DRAFT_EXTEND_V2 = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2


def _case(name, mode, prefix, new=1, **kw):
    return small_case(name, mode, prefix, new, heads=(2, 1), **kw)


BASE_CASES = [
    _case("dec", DECODE, (0, 5, 17, 40)),
    _case("ext", EXTEND, (0, 7, 20), (3, 1, 18)),
    _case("ext_big", EXTEND, (33, 4), (40, 21)),
    _case("tv", TARGET_VERIFY, (0, 9, 20), 4, topk=2),
    _case("dev2", DRAFT_EXTEND_V2, (0, 6, 19), 3),
]
ALL_CASES = [c.with_(name=f"{c.name}_p{page}_{lay}", page=page, layout=lay)
             for c in BASE_CASES for page in (1, 16) for lay in LAYOUTS]


def _ids(cases):
    return [c.name for c in cases]


def page_ids(req, page):
    """A request's page ids in logical order, read back from its slots."""
    return [req.slots[t] // page for t in range(0, req.total, page)]


def increasing(xs):
    return all(a < b for a, b in zip(xs, xs[1:]))


OLD_NEW = [(0, 3), (17, 1), (40, 5), (5, 30)]


@pytest.mark.parametrize("page", [1, 16])
def test_contiguous_pages_consecutive(page):
    """contiguous: each request's page ids are consecutive and increasing (place_pages and plan_case)."""
    for pages in place_pages("contiguous", page, OLD_NEW, random.Random(0)):
        assert pages == list(range(pages[0], pages[0] + len(pages)))
    plan = plan_case(_case("c", EXTEND, (0, 17, 40), (3, 1, 30), page=page))
    for req in plan.requests:
        ids = page_ids(req, page)
        assert ids == list(range(ids[0], ids[0] + len(ids)))
        assert req.slots == slots_of(ids, page, req.total)


def test_shuffled_pages_not_increasing_and_distinct():
    """shuffled_pages: some request's pages are out of order, and no page is given twice."""
    pages = place_pages("shuffled_pages", 1, OLD_NEW, random.Random(0))
    assert any(not increasing(p) for p in pages)
    flat = [p for ps in pages for p in ps]
    assert len(flat) == len(set(flat))
    plan = plan_case(_case("s", DECODE, (30, 30, 12), page=1, layout="shuffled_pages"))
    ids = [page_ids(r, 1) for r in plan.requests]
    assert any(not increasing(p) for p in ids)
    flat = [p for ps in ids for p in ps]
    assert len(flat) == len(set(flat))


@pytest.mark.parametrize("page", [1, 16])
def test_interleaved_pages_alternate(page):
    """interleaved_pages: request 0's page j < request 1's page j < request 0's page j+1, when both exist."""
    def check(pages):
        for a, b in zip(pages, pages[1:]):
            for j in range(min(len(a), len(b))):
                assert a[j] < b[j]
                if j + 1 < len(a):
                    assert b[j] < a[j + 1]
    check(place_pages("interleaved_pages", page, OLD_NEW, random.Random(0)))
    plan = plan_case(_case("i", EXTEND, (20, 40, 3), (20, 9, 40), page=page, layout="interleaved_pages"))
    ids = [page_ids(r, page) for r in plan.requests]
    assert sum(len(p) > 1 for p in ids) >= 2, "need several pages per request to see alternation"
    check(ids)


NONMONO_P1 = [c for c in ALL_CASES if c.layout == "non_monotonic_extend" and c.page == 1]


@pytest.mark.parametrize("case", NONMONO_P1, ids=_ids(NONMONO_P1))
def test_non_monotonic_extend_new_slots_not_increasing(case):
    """non_monotonic_extend at page 1: every request with >= 2 new tokens gets a non-increasing out_cache_loc."""
    fx = make_fixture(case)
    loc = fx.batch.out_cache_loc.tolist()
    start, checked = 0, 0
    for req in fx.plan.requests:
        mine = loc[start:start + req.n_new]
        start += req.n_new
        if req.n_new >= 2:
            assert not increasing(mine), f"request row {req.row}: {mine}"
            checked += 1
    assert checked or case.mode is DECODE


PAGE16 = [c for c in ALL_CASES if c.page == 16]


@pytest.mark.parametrize("case", PAGE16, ids=_ids(PAGE16))
def test_paged_invariant_page16(case):
    """At page 16 every layout keeps slot // P constant within a page and slot % P == t % P."""
    fx = make_fixture(case)
    r2t = fx.batch.req_to_token_pool.req_to_token
    P = case.page
    for req in fx.plan.requests:
        slots = r2t[req.row, :req.total].tolist()
        for t, s in enumerate(slots):
            assert s % P == t % P
            assert s // P == slots[t - t % P] // P
        assert len(set(page_ids(req, P))) == len(page_ids(req, P))


@pytest.mark.parametrize("case", ALL_CASES, ids=_ids(ALL_CASES))
def test_no_scratch_page_and_unique_slots(case):
    """No layout gives page 0 or slot 0 to a request, and slots are unique across the batch."""
    fx = make_fixture(case)
    all_slots = [s for r in fx.plan.requests for s in r.slots]
    assert min(all_slots) >= case.page  # page 0 holds scratch slot 0
    assert all(s // case.page != 0 for s in all_slots)
    assert len(all_slots) == len(set(all_slots))
    assert max(all_slots) < fx.plan.num_slots <= fx.pools.token_to_kv_pool.size


@pytest.mark.parametrize("case", ALL_CASES, ids=_ids(ALL_CASES))
def test_poison_pointers_past_last_token(case):
    """Unowned slots exist, and req_to_token entries past each request's last token point at unowned slots."""
    fx = make_fixture(case)
    kv = fx.pools.token_to_kv_pool
    owned = {s for r in fx.plan.requests for s in r.slots}
    unowned_count = kv.size - len(owned) - 1  # minus scratch slot 0
    assert unowned_count > 0
    # Unowned slots exist inside the plan's own slot range too (spare pages at least).
    assert any(s not in owned for s in range(1, fx.plan.num_slots))
    r2t = fx.batch.req_to_token_pool.req_to_token
    for req in fx.plan.requests:
        tail = r2t[req.row, req.total:].tolist()
        assert tail, "req_to_token must have columns past the last token"
        assert all(s != 0 and s not in owned for s in tail), f"row {req.row} tail points at an owned slot"
        assert all(0 < s < kv.size for s in tail)
    # Rows no request uses (other than the dummy row 0) also point at unowned slots only.
    used = {r.row for r in fx.plan.requests}
    for row in range(1, r2t.shape[0]):
        if row not in used:
            assert not set(r2t[row].tolist()) & (owned | {0})


@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.mode is DECODE and c.page == 1],
                         ids=_ids([c for c in ALL_CASES if c.mode is DECODE and c.page == 1]))
def test_poisoned_slots_differ_from_real_kv(case):
    """Poisoned (unowned) slots hold values unlike real K/V: |V| far larger than the real values."""
    fx = make_fixture(case)
    kv = fx.pools.token_to_kv_pool
    owned = torch.zeros(kv.size, dtype=torch.bool)
    owned[0] = True
    owned[[s for r in fx.plan.requests for s in r.slots]] = True
    v = kv.get_value_buffer(1)[~owned]
    assert v.mean().item() > 10 * fx.inputs[CASE_LAYER_ID].v_old.abs().mean().item()
