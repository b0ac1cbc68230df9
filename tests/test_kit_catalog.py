"""The case catalog keeps its promises: unique names, and the coverage the kit claims."""
import dataclasses
import functools
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backends.triton.metadata import SPLIT_TOKENS
from cases import CATALOG as catalog
from kit.engine.case import GQA, LAYOUTS, MHA, MQA, SMOKE_GQA, SMOKE_MHA, SMOKE_MQA, Case
from kit.engine import pairs
from kit.engine.catalog import CASE_SETS, Catalog
from kit.engine.fixture import Fixture, Step, _pools_for
from kit.engine.render import forward_batch
from kit.engine.profile import SGLANG
from kit.process.memory import STORE
from kit.engine.kv_quant import quantize
from kit.engine.layer import model_layers
from kit.engine.pools import CASE_LAYER_ID
from kit.modes import MODES, ForwardMode
from kit.engine.modes import rules_for
from kit.engine.modes.rules import causal
from kit.report.record import parse_run_id, run_id
from kit.engine.reference import attention
from kit.harness.checks import KVState, check_inputs, check_kv, check_output, handed_inputs, inputs_figures, read_back
from tests.mutants import CONTEXT_EDGE, FULL_TREE_BUCKET, MIXED_UNALIGNED, TREE_DRAFTS
from tests.mutants.triton import read_dense

REPO = Path(__file__).resolve().parent.parent
DECODE, EXTEND, MIXED = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED
TARGET_VERIFY, DRAFT_EXTEND_V2 = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2
DRAFT_DECODE = ForwardMode.DRAFT_DECODE
# The fewest requests a batch of the mode has (a MIXED batch: an extend row and a decode row).
MIN_BS = {MIXED: 2}


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_case_names_unique_per_mode(mode):
    """Repro commands find cases by name, so a name means one case (softmax or recurrent)."""
    names = [c.name for s in CASE_SETS for c in catalog.matrix_cases(s, mode)]
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
    assert any(c.bs == MIN_BS.get(mode, 1) for c in full) and any(c.bs >= 8 for c in full)
    assert any(max(c.prefix) > 1000 for c in full), "contexts past 1,000 tokens"
    assert any(c.window >= 0 for c in full) and any(c.cap > 0 for c in full)
    assert any(c.page > 1 and any(p % c.page == 0 and p > 0 for p in c.prefix) for c in full), "prefix exactly a page"
    assert any(c.page > 1 and any(p % c.page for p in c.prefix) for c in full), "crossing a page boundary"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_smoke_heads_keep_each_shape(mode):
    """The smoke set's small heads are still MHA, GQA (two KV heads: a query head read against the
    wrong KV head shows) and MQA, each with query groups larger than one where the shape has them."""
    dense = {c.heads for c in catalog.cases("smoke", mode) if not c.is_mla}
    assert {SMOKE_MHA, SMOKE_GQA, SMOKE_MQA} <= dense
    assert SMOKE_GQA[1] == 2 and SMOKE_GQA[0] > SMOKE_GQA[1] and SMOKE_MQA[1] == 1 < SMOKE_MQA[0]
    assert SMOKE_MHA[0] == SMOKE_MHA[1] > 1


@functools.lru_cache(maxsize=None)
def _probe(mode) -> pairs.Probe:
    """The mode's probe, its attention kinds' examples from the whole catalog."""
    every = [c for m in MODES for s in CASE_SETS for c in catalog.cases(s, m)]
    return pairs.probe_for([c for s in CASE_SETS for c in catalog.cases(s, mode)], every)


def _gaps_message(mode, case_set, gaps) -> str:
    proposals = "; ".join(f"{dict((k, v) for k, v in values.items() if v != pairs.BY_NAME[k].values[0])} "
                          f"({len(reached)} pairs)" for values, reached in pairs.covering(gaps, _probe(mode)))
    return (f"{mode.value} {case_set}: {len(gaps)} pairs of feature values no case reaches: "
            f"{', '.join(map(pairs.describe, gaps))}; cases reaching them, densest first (add them to "
            f"cases/{mode.value}.py): {proposals}")


@pytest.mark.parametrize("case_set", CASE_SETS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_pair_of_feature_values(case_set, mode):
    """Every pair of feature values a case of the mode can have (kit.engine.pairs) is some case's: a bug
    that needs two features is reached by the set, whichever two."""
    gaps = pairs.missing(catalog.cases(case_set, mode), _probe(mode))
    assert not gaps, _gaps_message(mode, case_set, gaps)


# The combinations no case of the full set had when the bug classes needing them went unseen: an e5m2
# cache in DECODE (no tree there), fp8 through a sliding window, fp8 with fused-QKV inputs.
ISSUE_PAIRS = [(DECODE, (("kv_dtype", "fp8_e5m2"), ("tree", False))),
               (TARGET_VERIFY, (("kv_dtype", "fp8_e4m3"), ("window", True))),
               (DRAFT_EXTEND_V2, (("kv_dtype", "fp8_e5m2"), ("inputs", "fused_qkv")))]


@pytest.mark.parametrize("mode, pair", ISSUE_PAIRS, ids=lambda v: v.value if isinstance(v, ForwardMode) else
                         pairs.describe(v))
def test_the_pairs_check_requires_fp8_with_each_feature(mode, pair):
    """An e5m2 cache in DECODE, fp8 through a sliding window, fp8 with fused-QKV inputs are pairs the check
    requires, and a catalog without them fails it, naming the pair and a case that reaches it."""
    probe = _probe(mode)
    assert pair in pairs.possible_pairs(probe)
    without = [c for c in catalog.cases("smoke", mode) if set(pair) - set(pairs.values_of(c))]
    gaps = pairs.missing(without, probe)
    assert pair in gaps
    proposed = [values for values, reached in pairs.covering(gaps, probe) if pair in reached]
    assert len(proposed) == 1 and probe.case(proposed[0]).kv_dtype == pair[0][1]


def test_pairs_are_possible_as_the_case_rules_say():
    """Which pairs are required follows Case validation: MLA takes no window, sinks or fused inputs (so
    those pairs are not required), only the speculative modes' drafts are trees (TARGET_VERIFY,
    DRAFT_EXTEND_V2, DRAFT_DECODE)."""
    for mode in MODES:
        possible = set(pairs.possible_pairs(_probe(mode)))
        assert (("kind", "mla"), ("window", True)) not in possible
        assert (("kind", "mla"), ("sinks", True)) not in possible
        assert (("kind", "mla"), ("inputs", "fused_qkv")) not in possible
        assert (("kind", "mla"), ("kv_dtype", "fp8_e5m2")) in possible
        assert any(("tree", True) in pair for pair in possible) == (mode in (TARGET_VERIFY, DRAFT_EXTEND_V2, DRAFT_DECODE)), mode


def test_zero_prefix_and_trees_covered():
    for mode in (DECODE, EXTEND, MIXED, DRAFT_EXTEND_V2):
        assert any(0 in c.prefix for c in catalog.cases("full", mode)), mode
    for case_set in CASE_SETS:
        for mode in (TARGET_VERIFY, DRAFT_DECODE):
            assert {c.topk for c in catalog.cases(case_set, mode)} >= {1, 2}, mode
        # only a window shows whether a draft sits at seq_len + depth or + index
        assert any(c.topk > 1 and c.window >= 0 for c in catalog.cases(case_set, TARGET_VERIFY))
        assert any(0 <= c.window < max(c.prefix) for c in catalog.cases(case_set, DRAFT_EXTEND_V2))


def _draft_fields(c: Case) -> set:
    """A tree whose draft count is not its steps + 1 (a graph stride of steps + 1 instead of the
    draft count goes wrong only there, sgl-project/sglang#27545)."""
    return {"draft count apart from the steps"} if c.steps is not None and c.steps + 1 != c.new else set()


@pytest.mark.parametrize("mode, reaches", [(DRAFT_EXTEND_V2, TREE_DRAFTS), (DRAFT_DECODE, FULL_TREE_BUCKET),
                                           (DRAFT_DECODE, CONTEXT_EDGE), (MIXED, MIXED_UNALIGNED)],
                         ids=["tree_drafts", "full_tree_bucket", "context_edge", "mixed_unaligned"])
def test_speculative_and_mixed_bug_classes_reachable(mode, reaches):
    """Each set has the cases these bug classes need (tests/mutants: the predicates their mutants
    reach): DRAFT_EXTEND_V2 trees of another draft count than steps + 1 at bs > 1 (#27545); a draft
    decode bucket full of K lanes over long rows (#27338); one of rows within `steps` of the model's
    context length (#29695); MIXED decode rows off the page (PR 38180)."""
    for case_set in CASE_SETS:
        assert any(reaches(c) for c in catalog.cases(case_set, mode)), case_set


def _cap_bites(c: Case) -> bool:
    """Scores of unit-variance q and k have std sm_scale * sqrt(head_dim); a cap within 3 of
    those changes the softmax (cap 5 at scale 0.25), a looser one barely does."""
    return c.cap < 3 * c.sm_scale * c.head_dim ** 0.5


def _page_features(c: Case) -> set:
    found = {f"page {c.page}"}
    if c.page > 1 and any(p % c.page == 0 and p > 0 for p in c.prefix):
        found.add("prefix exactly a page multiple")
    if c.page > 1 and any(p % c.page for p in c.prefix):
        found.add("prefix crossing a page boundary")
    return found


def _new_features(c: Case) -> set:
    if c.mode not in (EXTEND, MIXED):
        return _draft_fields(c)  # one count for the batch
    return (({"ragged extend"} if len(set(c.new_lens)) > 1 else set())
            | ({"one-token extend"} if 1 in c.new_lens else set())
            | ({"extend of 64+ tokens"} if max(c.new_lens) >= 64 else set()))


# The features a case has, field by field (a field added to Case needs its line here; None:
# identity, not a feature). The dtype feature puts bf16 and fp32 together: the CPU runs fp32
# where the GPU runs bf16.
FEATURES = {
    "name": None, "mode": None, "seed": None, "request_seeds": None,  # data identity, no feature
    "prefix": lambda c: {f"bs {'1' if c.bs == 1 else '8+' if c.bs >= 8 else '2-7'}"}
    | ({"zero prefix"} if 0 in c.prefix else set())
    | ({"context past 1,000 tokens"} if max(map(sum, zip(c.prefix, c.new_lens))) > 1000 else set()),
    "new": _new_features,
    "page": _page_features,
    # How query heads share KV heads (the smoke set's head counts are smaller: kit.engine.case).
    "heads": lambda c: {"one KV head" if c.num_kv_heads == 1 else "a KV head per query head"
                        if c.num_q_heads == c.num_kv_heads else "query groups over KV heads"},
    "head_dim": lambda c: {f"head_dim {c.head_dim}"},
    "dtype": lambda c: {"fp16" if c.dtype == "fp16" else "bf16 or fp32"},
    "window": lambda c: {"window" if c.window >= 0 else "no window"},
    "cap": lambda c: {"no cap" if not c.cap else "cap that bites" if _cap_bites(c) else "loose cap"},
    "scale": lambda c: {"default sm_scale" if c.scale is None else "sm_scale set"},
    "topk": lambda c: {"chain"} if c.topk == 1 else {"tree"} | ({"tree with window"} if c.window >= 0 else set())
    | ({"tree with cap"} if c.cap else set()),
    "layout": lambda c: {c.layout},
    "hybrid": lambda c: {"hybrid layers" if c.hybrid else "uniform layers"},
    "kv_lora_rank": lambda c: {"mla" if c.is_mla else "dense"},
    "kv_dtype": lambda c: {f"kv cache {c.kv_dtype or 'in dtype'}"},
    "rope_dim": lambda c: set(),  # MLA's widths: head_dim's feature (rank + rope) covers them
    "index_topk": lambda c: set() if not c.index_topk else {"sparse top-k"}
    | ({"top-k past a context"} if min(c.prefix) + 1 <= c.index_topk else set())
    | ({"top-k below a context"} if max(c.prefix) >= c.index_topk else set()),
    "index_scatter": lambda c: {"-1 padding among the indices"} if c.index_scatter else set(),
    "steps": _draft_fields,
    "context_edge": lambda c: {"at the model's context edge"} if c.context_edge else set(),
    "inputs": lambda c: {f"inputs {c.inputs}"},
    "sinks": lambda c: {"sinks" if c.sinks else "no sinks"} | ({"sinks with window"} if c.sinks and c.window >= 0
                                                                else set()),
}


def case_features(c: Case) -> set:
    return set().union(*(f(c) for f in FEATURES.values() if f))


def test_features_cover_every_case_field():
    assert set(FEATURES) == {f.name for f in dataclasses.fields(Case)}


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_smoke_has_every_feature_of_full(mode):
    """CI runs the smoke set: whatever the GPU's full set exercises, the CPU exercises too."""
    full = set().union(*map(case_features, catalog.cases("full", mode)))
    smoke = set().union(*map(case_features, catalog.cases("smoke", mode)))
    assert full <= smoke, f"in the full set, not in the smoke set: {sorted(full - smoke)}"


def test_smoke_runs_on_cpu_dtypes():
    for mode in MODES:
        assert "fp32" in {c.dtype for c in catalog.cases("smoke", mode)}


MLA_OK = dict(heads=(16, 1), head_dim=576, kv_lora_rank=512, rope_dim=64, scale=192 ** -0.5)


def test_an_mla_line_is_valid():
    case = Case(name="ok", mode=ForwardMode.DECODE, prefix=(3, 4), **MLA_OK)
    assert case.is_mla and case.v_head_dim == 512 and case.kind == "mla"
    assert case.kernel_variant.endswith("-mla512r64")


@pytest.mark.parametrize("bad, message", [
    (dict(name="has-dash"), "test ids split on '-'"),
    (dict(dtype="int8"), "dtype"),
    (dict(layout="spiral"), "layout"),
    (dict(mode=ForwardMode.EXTEND, new=(1,)), "one extend length"),
    (dict(mode=ForwardMode.TARGET_VERIFY, new=(2, 2)), "takes one int"),
    (dict(new=2), "exactly one new token"),
    (dict(topk=2), "topk > 1 only applies"),
    (dict(prefix=(3, -1)), "bad prefix lengths"),
    (dict(prefix=(3.5, 4)), "bad prefix lengths"),
    (dict(page=0), "page 0 must be an int >= 1"),
    (dict(head_dim=0), "head_dim 0 must be an int >= 1"),
    (dict(head_dim=-64), "head_dim -64 must be an int >= 1"),
    (dict(heads=(8, 3)), "kv dividing q"),
    (dict(heads=(8, 0)), "kv dividing q"),
    (dict(mode=ForwardMode.TARGET_VERIFY, new=2, topk=0), "topk 0 must be an int >= 1"),
    (dict(window=-2), "window -2 must be an int >= 0, or -1"),
    (dict(cap=-1.0), "cap -1.0 must be a number >= 0"),
    (dict(scale=0.0), "scale 0.0 must be a number > 0"),
    (dict(scale=-0.1), "scale -0.1 must be a number > 0"),
    (dict(mode="decode"), "is not a ForwardMode"),
    (dict(mode=ForwardMode.EXTEND, new=(1, 2.5)), "must be an int or one int per request"),
    (dict(MLA_OK, heads=(8, 2)), "MLA has one latent KV head: heads (8, 2) must be (q, 1)"),
    (dict(MLA_OK, head_dim=128), "MLA head_dim 128 must be kv_lora_rank + rope_dim = 576"),
    (dict(MLA_OK, scale=None), "MLA needs an explicit scale"),
    (dict(MLA_OK, window=8), "MLA cases take no window, cap, hybrid layers or sinks"),
    (dict(MLA_OK, cap=5.0), "MLA cases take no window, cap, hybrid layers or sinks"),
    (dict(MLA_OK, hybrid=True), "MLA cases take no window, cap, hybrid layers or sinks"),
    (dict(MLA_OK, sinks=True), "MLA cases take no window, cap, hybrid layers or sinks"),
    (dict(sinks=1), "sinks 1 must be True or False"),
    (dict(MLA_OK, kv_lora_rank=-1), "kv_lora_rank -1 and rope_dim 64 must be ints >= 0"),
    (dict(rope_dim=64), "rope_dim applies to MLA (latent attention) only"),
    (dict(inputs="packed"), "inputs 'packed' not in ('contiguous', 'fused_qkv')"),
    (dict(MLA_OK, inputs="fused_qkv"), "MLA inputs are contiguous"),
    (dict(kv_dtype="fp8"), "kv_dtype 'fp8' not in [None, 'fp8_e4m3', 'fp8_e5m2']"),
    (dict(kv_dtype="fp8_e4m3fn"), "kv_dtype 'fp8_e4m3fn' not in"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_case_rejects_bad_lines(bad, message):
    """A malformed case line fails where it is declared (file:line), saying what is wrong,
    instead of failing later inside the kit or being blamed on a backend."""
    fields = dict(name="ok", mode=ForwardMode.DECODE, prefix=(3, 4))
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        Case(**{**fields, **bad})  # the line the error must name
    assert str(err.value).startswith(f"{__file__}:{_line_of('Case(**{**fields, **bad})')}: case ")


def _line_of(text: str) -> int:
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if line.strip().startswith(text))


def test_case_error_names_the_catalog_line(tmp_path):
    """A case made through a partial (as cases/*.py make them) or with_() is blamed on the
    catalog's own line, not on the kit."""
    (tmp_path / "bad_cases.py").write_text(
        "from functools import partial\nfrom kit.engine.case import Case\nfrom kit.modes import ForwardMode\n"
        "C = partial(Case, mode=ForwardMode.DECODE)\nOK = C('ok', prefix=(3,))\n"
        "BAD = OK.with_(head_dim=0)\n")
    proc = subprocess.run([sys.executable, "-c", "import bad_cases"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert f"ValueError: {tmp_path / 'bad_cases.py'}:6: case 'ok': head_dim 0 must be an int >= 1" in proc.stderr, \
        proc.stderr


def test_run_id_round_trips():
    """One parser for run ids; a backend label may hold '-' (mode, exec and case never do)."""
    for backend in ("triton", "my-backend", "a-b-c"):
        rid = run_id(backend, "target_verify", "graph", "gqa_tree8_p16_shuf")
        assert parse_run_id(rid) == (backend, "target_verify", "graph", "gqa_tree8_p16_shuf")
    with pytest.raises(ValueError, match="not a run id"):
        parse_run_id("no_dashes_here")


def test_every_mode_has_rules_and_cases():
    """A mode is its rules file (kit/engine/modes/<mode>.py) plus its cases file (cases/<mode>.py)."""
    for mode in MODES:
        assert rules_for(mode).mode is mode
        assert catalog.cases("smoke", mode) and catalog.cases("full", mode)
    assert [m.value for m in MODES] == ["decode", "extend", "mixed", "target_verify", "draft_extend_v2",
                                        "draft_decode"]


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


# Depth of catching: each kernel bug class of the mutant catalog, planted in the reference
# (the float64 attention of the bug, rounded to the case's dtype as a kernel rounds its
# output), must fail the kit's output check in at least MIN_CATCHING distinct full-set
# cases of every mode it affects, with MARGIN to spare: the GPU draws other inputs.
MIN_CATCHING, MARGIN = 3, 1.5


def _case_bug(changes):
    """A bug in the layer config: changes(case) -> the Case fields to replace; the plan stays,
    the model's layers follow the changed case."""
    def plant(fx):
        case = fx.case.with_(**changes(fx.case))
        return dataclasses.replace(fx, plan=dataclasses.replace(fx.plan, case=case), layers=model_layers(case))
    return plant


def _request_bug(change):
    """A bug in what each request attends: change(request) -> its RequestPlan fields to replace."""
    def plant(fx):
        requests = [dataclasses.replace(r, **change(r)) for r in fx.plan.requests]
        return dataclasses.replace(fx, plan=dataclasses.replace(fx.plan, requests=requests))
    return plant


def _without_key(r, key):
    visible = r.visible.clone()
    visible[:, key] = False
    return dict(visible=visible)


def _input_bug(change):
    """A bug in what a kernel reads of a layer's inputs: change(inputs, layer) -> the LayerInputs fields to replace."""
    def plant(fx):
        return dataclasses.replace(fx, inputs=[dataclasses.replace(x, **change(x, layer))
                                               for x, layer in zip(fx.inputs, fx.layers)])
    return plant


def _rope_dropped(x, layer):
    q = x.q.clone()
    q[..., layer.kv_lora_rank:] = 0
    return dict(q=q)


def _values_from_rope_tail(x, layer):
    r, p = layer.kv_lora_rank, layer.rope_dim
    return dict(v_new=x.k_new[..., p:p + r], v_old=x.k_old[..., p:p + r])


def _is_mla(c):
    return c.is_mla


def _read_dense(x, layer):
    """q read with the dense strides of its shape from the fused QKV row it was handed in."""
    return dict(q=read_dense(x.handed("fused_qkv")[0]))


def _fp8_read_bug(read_scales):
    """A quantized cache read with the wrong scales: read_scales(layer) -> the (k, v) scales the
    kernel multiplies the stored values by. The planted batch holds what that kernel reads, in an
    unquantized cache (the stored values times those scales, exact in the case's dtype)."""
    def plant(fx):
        case, dtype = fx.case.with_(kv_dtype=None), fx.case.kv_torch_dtype

        def read(t, scale, by):
            return (quantize(t, scale, dtype).float() * by).to(t.dtype)
        inputs = []
        for x, layer in zip(fx.inputs, fx.layers):
            k_by, v_by = read_scales(layer)
            inputs.append(dataclasses.replace(
                x, k_new=read(x.k_new, layer.k_scale, k_by), k_old=read(x.k_old, layer.k_scale, k_by),
                v_new=read(x.v_new, layer.v_scale, v_by), v_old=read(x.v_old, layer.v_scale, v_by)))
        return dataclasses.replace(fx, plan=dataclasses.replace(fx.plan, case=case), layers=model_layers(case),
                                   inputs=inputs)
    return plant


def _is_fp8(c):
    return c.kv_dtype is not None


def _has_sinks(c):
    return c.sinks


def _sink_counted_as_value(fx) -> torch.Tensor:
    """The sink as a key whose value is V of the request's first token: the right output plus the
    sink's share of the mass (1 - the output of all-ones values) times that V."""
    ones = _input_bug(lambda x, layer: dict(v_new=torch.ones_like(x.v_new), v_old=torch.ones_like(x.v_old)))(fx)
    share = 1 - attention(ones, torch.float64)
    group = fx.case.num_q_heads // fx.case.num_kv_heads
    first = torch.cat([v[:1].expand(r.n_new, -1, -1) for r, (_, v) in zip(fx.plan.requests, fx.logical_kv())])
    return attention(fx, torch.float64) + share * first.to(torch.float64).repeat_interleave(group, dim=1)


def _sink_folded_per_split(fx) -> torch.Tensor:
    """Split-KV decode folding the sink into each split: in its mildest form, a request of two
    splits (more than SPLIT_TOKENS keys) counts it twice; a request of one split is right."""
    layers = list(fx.layers)
    layers[CASE_LAYER_ID] = dataclasses.replace(layers[CASE_LAYER_ID],
                                                sinks=tuple(s + math.log(2) for s in layers[CASE_LAYER_ID].sinks))
    twice = attention(dataclasses.replace(fx, layers=tuple(layers)), torch.float64)
    split = torch.tensor([r.total > SPLIT_TOKENS for r in fx.plan.requests for _ in range(r.n_new)])
    return torch.where(split[:, None, None], twice, attention(fx, torch.float64))


# mutant number, name -> (modes, applies to case, the bug planted in a fixture)
BUG_CLASSES = {
    (7, "window one short"): (MODES, lambda c: c.window > 0, _case_bug(lambda c: dict(window=c.window - 1))),
    (7, "window one long"): (MODES, lambda c: c.window >= 0, _case_bug(lambda c: dict(window=c.window + 1))),
    (8, "tree mask ignored"): ((TARGET_VERIFY,), lambda c: c.topk > 1, _request_bug(
        lambda r: dict(visible=causal(r.n_old, r.n_new)))),
    (9, "decode one key short"): ((DECODE,), lambda c: True, _request_bug(lambda r: _without_key(r, r.total - 1))),
    (9, "prefix one key short"): ((EXTEND, MIXED, TARGET_VERIFY, DRAFT_EXTEND_V2, DRAFT_DECODE),
                                  lambda c: max(c.prefix) > 0,
                                  _request_bug(lambda r: _without_key(r, r.n_old - 1) if r.n_old else {})),
    (12, "cap ignored"): ((TARGET_VERIFY,), lambda c: c.cap > 0, _case_bug(lambda c: dict(cap=0.0))),
    (13, "verify window on token index"): ((TARGET_VERIFY,), lambda c: c.window >= 0 and c.topk > 1, _request_bug(
        lambda r: dict(q_pos=[r.seq_len + i for i in range(r.n_new)]))),
    (14, "draft positions from seq_lens"): ((DRAFT_EXTEND_V2,), lambda c: c.window >= 0, _request_bug(
        lambda r: dict(q_pos=[r.seq_len + i for i in range(r.n_new)]))),
    (40, "MLA rope part dropped from the score"): (MODES, _is_mla, _input_bug(_rope_dropped)),
    (41, "MLA values from the rope tail"): (MODES, _is_mla, _input_bug(_values_from_rope_tail)),
    (42, "MLA scale from head_dim 576"): (MODES, _is_mla, _case_bug(lambda c: dict(scale=c.head_dim ** -0.5))),
    (50, "q/k/v read with dense strides"): (MODES, lambda c: c.inputs == "fused_qkv", _input_bug(_read_dense)),
    (60, "fp8 scale applied twice"): (MODES, _is_fp8, _fp8_read_bug(lambda l: (l.k_scale ** 2, l.v_scale ** 2))),
    (61, "fp8 scale ignored"): (MODES, _is_fp8, _fp8_read_bug(lambda l: (1.0, 1.0))),
    (62, "fp8 K scale used for V"): (MODES, lambda c: _is_fp8(c) and not c.is_mla,
                                     _fp8_read_bug(lambda l: (l.k_scale, l.k_scale))),
    (47, "sink ignored"): (MODES, _has_sinks, _case_bug(lambda c: dict(sinks=False))),
    (48, "sink counted as a value"): (MODES, _has_sinks, _sink_counted_as_value),
    (49, "sink folded per split"): ((DECODE,), _has_sinks, _sink_folded_per_split),
}


def _case_batch(case) -> Step:
    """The case's batch (plan, model, inputs) as its runs build it, without a pool, a batch
    object or the earlier batches of its eager sequence: the reference reads none of them."""
    built = STORE.batches.get(case, torch.device("cpu"))
    return Step(0, built.plan, None, built.layers, built.program_inputs)


def _bugged(plant, fx) -> torch.Tensor:
    """The float64 output of the case's layer with the bug planted: a plant gives the changed batch,
    or (a bug no batch describes) the output itself."""
    planted = plant(fx)
    return planted if isinstance(planted, torch.Tensor) else attention(planted, torch.float64)


def _cheapest_first(mode, applies=lambda case: True):
    """The base cases (contiguous layout: the others only move pages) of the full set, the
    smallest attention first: the depth tests stop once every bug class is caught often enough."""
    cases = [c for c in catalog.cases("full", mode) if c.layout == "contiguous" and applies(c)]
    return sorted(cases, key=lambda c: (c.size, c.name))


def catching_cases(mode) -> dict:
    """(number, bug) -> base cases whose output check the bug fails by MARGIN, MIN_CATCHING of
    them where the full set has that many."""
    bugs = {key: (applies, plant) for key, (modes, applies, plant) in BUG_CLASSES.items() if mode in modes}
    caught = {key: [] for key in bugs}
    for case in _cheapest_first(mode):
        todo = {key: plant for key, (applies, plant) in bugs.items() if len(caught[key]) < MIN_CATCHING and applies(case)}
        if not todo:
            continue
        fx = _case_batch(case)
        dtype = case.torch_dtype
        golden, same = attention(fx, torch.float64), attention(fx, dtype)
        for key, plant in todo.items():
            if check_output(_bugged(plant, fx).to(dtype), golden, same, dtype).excess >= MARGIN:
                caught[key].append(case.name)
    return caught


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_kernel_bug_class_is_caught_by_three_full_cases(mode):
    """No single case stands between the kit and a kernel bug (the GPU mutation table counts
    the real mutants; this is its CPU proxy on the same cases)."""
    short = {f"{n} {bug}": cases for (n, bug), cases in catching_cases(mode).items() if len(cases) < MIN_CATCHING}
    assert not short, f"bug classes caught by fewer than {MIN_CATCHING} full cases: {short}"


# MLA's KV-write bug classes, planted in the pool: how each layer's new latent rows are written
# (pool, layer id, out_cache_loc, the rows). The KV check must fail in MIN_CATCHING full cases.
KV_BUG_CLASSES = {
    (43, "MLA latent to the wrong layer"): lambda pool, lid, loc, rows: pool.k_buffer[0].index_copy_(0, loc, rows),
    (43, "MLA latent to the wrong page"): lambda pool, lid, loc, rows: pool.k_buffer[lid].index_copy_(
        0, (loc + pool.page_size) % pool.size, rows),
    (44, "MLA rope part not written"): lambda pool, lid, loc, rows: pool.v_buffer[lid].index_copy_(
        0, loc, rows[..., :pool.kv_lora_rank]),
}


def _written_batch(case) -> Fixture:
    """The case's batch over a pool, without the references a run computes first (the KV
    check reads none of them)."""
    built, cpu = STORE.batches.get(case, torch.device("cpu")), torch.device("cpu")
    pools = _pools_for([built.plan], case, cpu, STORE, SGLANG)
    batch = forward_batch(built.plan, pools, cpu)
    fx = Fixture(plan=built.plan, pools=pools, layers=built.layers, batch=batch,
                 steps=[Step(0, built.plan, batch, built.layers, built.program_inputs)],
                 program_inputs=built.program_inputs)
    fx.tables = built.tables
    return fx


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_every_mla_kv_bug_class_is_caught_by_three_full_cases(mode):
    caught = {key: [] for key in KV_BUG_CLASSES}
    # the latent's bytes as written: unquantized cases
    for case in _cheapest_first(mode, lambda c: _is_mla(c) and not c.kv_dtype):
        if all(len(cases) >= MIN_CATCHING for cases in caught.values()):
            break
        fx = _written_batch(case)
        pool, loc = fx.pools.token_to_kv_pool, fx.batch.out_cache_loc
        writes = {lid: (x.k_new, x.v_new) for lid, x in enumerate(fx.inputs)}
        for key, write in KV_BUG_CLASSES.items():
            fx.install()
            for lid, x in enumerate(fx.inputs):
                write(pool, lid, loc, x.k_new)
            if not check_kv(pool, KVState(fx.old_slots(), fx.installed_kv(), loc, writes)).ok:
                caught[key].append(case.name)
    short = {f"{n} {bug}": cases for (n, bug), cases in caught.items() if len(cases) < MIN_CATCHING}
    assert not short, f"MLA KV bug classes caught by fewer than {MIN_CATCHING} full cases: {short}"


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_an_input_written_in_place_is_caught_by_three_full_cases(mode):
    """Mutant 51's class (q scaled in place by the softmax scale), planted in the copies each
    full case hands forward(): the inputs check must fail in MIN_CATCHING full cases."""
    caught = []
    for case in catalog.cases("full", mode):
        if case.layout != "contiguous":
            continue
        fx = _case_batch(case)
        given = [x.handed(case.inputs) for x in fx.inputs]
        for (q, _, _), layer in zip(given, fx.layers):
            q.mul_(layer.scaling)
        if not check_inputs(read_back([inputs_figures(handed_inputs(fx, given))])).ok:
            caught.append(case.name)
    assert len(caught) >= MIN_CATCHING, f"an input written in place is caught by {caught} only"
