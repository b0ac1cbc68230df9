"""The case catalog keeps its promises: unique names, and the coverage the kit claims."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cases import CATALOG as catalog
from kit.case import GQA, LAYOUTS, MHA, MQA, Case
from kit.catalog import CASE_SETS, Catalog
from kit.modes import MODES, ForwardMode
from kit.record import parse_run_id, run_id

REPO = Path(__file__).resolve().parent.parent


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
    for case_set in CASE_SETS:  # only a window shows whether a draft sits at seq_len + depth or + index
        assert any(c.topk > 1 and c.window >= 0 for c in catalog.cases(case_set, ForwardMode.TARGET_VERIFY))
        assert any(c.window >= 0 and c.window < max(c.prefix) for c in catalog.cases(case_set, ForwardMode.DRAFT_EXTEND_V2))


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


def test_run_id_round_trips():
    """One parser for run ids; a backend label may hold '-' (mode, exec and case never do)."""
    for backend in ("triton", "my-backend", "a-b-c"):
        rid = run_id(backend, "target_verify", "graph", "gqa_tree8_p16_shuf")
        assert parse_run_id(rid) == (backend, "target_verify", "graph", "gqa_tree8_p16_shuf")
    with pytest.raises(ValueError, match="not a run id"):
        parse_run_id("no_dashes_here")


def test_every_mode_has_rules_and_cases():
    """A mode is its rules file (kit/modes/<mode>.py) plus its cases file (cases/<mode>.py)."""
    for mode in MODES:
        assert mode.rules.mode is mode
        assert catalog.cases("smoke", mode) and catalog.cases("full", mode)
    assert [m.value for m in MODES] == ["decode", "extend", "target_verify", "draft_extend_v2"]


OTHER_CATALOG = Catalog({ForwardMode.DECODE: {"smoke": [Case("only_one", ForwardMode.DECODE, prefix=(4, 9),
                                                            heads=(4, 2), head_dim=16, dtype="fp32")], "full": []}})


def test_cases_option_takes_another_catalog(tmp_path):
    """`--cases module:attr` runs another catalog; its repro names it too."""
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider",
                           "--backend", "torch_native", "--exec", "eager", "--case-set", "smoke",
                           "--cases", "tests.test_kit_catalog:OTHER_CATALOG", "--results-json", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads(out.read_text())["records"]
    assert [(r["mode"], r["case"], r["outcome"]) for r in records] == [("decode", "only_one", "pass")]
    assert "--cases tests.test_kit_catalog:OTHER_CATALOG" in records[0]["repro"]
    proc = subprocess.run([sys.executable] + shlex.split(records[0]["repro"])[1:], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and ": pass" in proc.stdout, proc.stdout + proc.stderr
