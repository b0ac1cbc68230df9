"""The case catalog keeps its promises: unique names, and the coverage the kit claims."""
import re

import pytest

from cases import CATALOG as catalog
from kit.case import GQA, LAYOUTS, MHA, MQA, Case
from kit.catalog import CASE_SETS
from kit.modes import MODES, ForwardMode


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_case_names_unique_per_mode(mode):
    """Repro commands find cases by name, so a name means one case."""
    names = [c.name for s in CASE_SETS for c in catalog.cases(s, mode)]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("case_set", CASE_SETS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_layout_in_every_mode(case_set, mode):
    assert {c.layout for c in catalog.cases(case_set, mode)} == set(LAYOUTS)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_full_set_coverage(mode):
    full = catalog.cases("full", mode)
    assert {c.page for c in full} >= {1, 16, 64}
    assert {c.heads for c in full} >= {MHA, GQA, MQA}
    assert {c.head_dim for c in full} >= {64, 128}
    assert {c.dtype for c in full} >= {"bf16", "fp16"}
    assert any(c.bs == 1 for c in full) and any(c.bs >= 8 for c in full)
    assert any(max(c.prefix) > 1000 for c in full), "contexts past 1,000 tokens"
    assert any(c.window >= 0 for c in full) and any(c.cap > 0 for c in full)
    assert any(c.page > 1 and any(p % c.page == 0 and p > 0 for p in c.prefix) for c in full), "prefix exactly a page"
    assert any(c.page > 1 and any(p % c.page for p in c.prefix) for c in full), "crossing a page boundary"


def test_zero_prefix_and_trees_covered():
    for mode in (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND_V2):
        assert any(0 in c.prefix for c in catalog.cases("full", mode)), mode
    assert {c.topk for c in catalog.cases("full", ForwardMode.TARGET_VERIFY)} >= {1, 2}
    assert {c.topk for c in catalog.cases("smoke", ForwardMode.TARGET_VERIFY)} >= {1, 2}


def test_smoke_runs_on_cpu_dtypes():
    for mode in MODES:
        assert "fp32" in {c.dtype for c in catalog.cases("smoke", mode)}


@pytest.mark.parametrize("bad, message", [
    (dict(name="has-dash"), "test ids split on '-'"),
    (dict(dtype="int8"), "dtype"),
    (dict(layout="spiral"), "layout"),
    (dict(mode=ForwardMode.EXTEND, new=(1,)), "one extend length"),
    (dict(mode=ForwardMode.TARGET_VERIFY, new=(2, 2)), "takes one int"),
    (dict(new=2), "exactly one new token"),
    (dict(topk=2), "topk > 1 only applies"),
    (dict(prefix=(3, -1)), "bad page size or prefix"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_case_rejects_bad_lines(bad, message):
    """A malformed case line fails at import, saying what is wrong."""
    fields = dict(name="ok", mode=ForwardMode.DECODE, prefix=(3, 4))
    with pytest.raises(ValueError, match=re.escape(message)):
        Case(**{**fields, **bad})
