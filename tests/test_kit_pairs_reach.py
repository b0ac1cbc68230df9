"""The pairs features of the engines' row order and of a window starting on a page's last slot
(kit.engine.features): the pairs check requires them, and a backend with the bug each one is for fails
the catalog's cases that have it and passes those that do not."""
import dataclasses

import pytest

from backends.torch_native import TorchNativeBackend
from cases import CATALOG
from kit.engine import pairs
from kit.engine.features import BY_NAME
from kit.engine.profile import DECODE_FIRST
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND


class RowsAsScheduled(TorchNativeBackend):
    """Under an engine that hands decode rows first, reads its requests in the order they were
    scheduled: the query rows of one request attended with another's keys."""

    profile = dataclasses.replace(TorchNativeBackend.profile, name="decode-first", row_order=DECODE_FIRST)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        step = dataclasses.replace(batch.step, requests=sorted(batch.step.requests, key=lambda r: r.request))
        return super().forward(q, k, v, layer, dataclasses.replace(batch, step=step), save_kv_cache)


class WindowStartPageRoundedUp(TorchNativeBackend):
    """Starts a sliding window at the page after its start's where the start is a page's last slot (its
    first page rounded up): the window's first key dropped there, every other start right."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        w, page = layer.sliding_window_size, batch.token_to_kv_pool.page_size
        if w >= 0:
            requests = [dataclasses.replace(r, visible=r.visible.clone()) for r in batch.step.requests]
            for r in requests:
                for i, pos in enumerate(r.q_pos):
                    start = pos - w
                    if start >= 0 and start % page == page - 1:
                        r.visible[i, r.key_pos.index(start)] = False
            batch = dataclasses.replace(batch, step=dataclasses.replace(batch.step, requests=requests))
        return super().forward(q, k, v, layer, batch, save_kv_cache)


def _split(mode, feature, more=lambda c: True):
    """The mode's smoke cases (dense, eager-run cheap) with and without the feature on."""
    cases = [c for c in CATALOG.cases("smoke", mode) if c.kind == "dense" and not c.kv_dtype and more(c)]
    return [c for c in cases if BY_NAME[feature].of(c)], [c for c in cases if not BY_NAME[feature].of(c)]


@pytest.mark.parametrize("backend, mode, feature, more", [
    ("tests.test_kit_pairs_reach:RowsAsScheduled", EXTEND, "row_order", lambda c: True),
    ("tests.test_kit_pairs_reach:WindowStartPageRoundedUp", DECODE, "window_page_edge", lambda c: c.window >= 0),
], ids=["rows_as_scheduled", "window_start_page_rounded_up"])
def test_a_backend_with_the_feature_s_bug_fails_the_cases_that_have_it(backend, mode, feature, more):
    on, off = _split(mode, feature, more)
    assert on and off, (feature, [c.name for c in on], [c.name for c in off])
    assert all(run_case(backend, c, Exec.EAGER).outcome == "fail" for c in on[:2]), [c.name for c in on[:2]]
    assert all(run_case(backend, c, Exec.EAGER).outcome == "pass" for c in off[:2]), [c.name for c in off[:2]]


@pytest.mark.parametrize("mode, pair", [(EXTEND, (("window", True), ("row_order", True))),
                                        (DECODE, (("page", 16), ("window_page_edge", True)))],
                         ids=["extend_window_reordered", "decode_page16_window_edge"])
def test_the_pairs_check_requires_each_new_feature(mode, pair):
    """A set without the pair fails the check, naming it, with a case that reaches it."""
    cases = CATALOG.cases("smoke", mode)
    probe = pairs.probe_for(cases, [c for m in (DECODE, EXTEND) for c in CATALOG.cases("smoke", m)])
    assert pair in pairs.possible_pairs(probe)
    without = [c for c in cases if set(pair) - set(pairs.values_of(c))]
    gaps = pairs.missing(without, probe)
    assert pair in gaps
    proposed = [values for values, reached in pairs.covering(gaps, probe) if pair in reached]
    assert proposed and all(BY_NAME[name].of(probe.case(proposed[0])) == value for name, value in pair)
