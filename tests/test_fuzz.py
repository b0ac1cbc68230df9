"""The fuzzer (`python -m kit fuzz`): it draws valid cases over every feature, finds a planted bug
that no case of the catalog reaches within its CI budget and shrinks it to the case the bug needs,
prints the case line and a repro that re-runs exactly that case, reports a known failure by its
KF id, and appends every run to the ledger; and a seeded fuzz of the in-box backends finds nothing."""
import argparse
import ast
import json
import shlex
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings

from backends.vllm.adapter import VllmTritonAttnBackend
from cases import CATALOG
from kit.__main__ import main as kit_main
from kit.engine.case import DTYPES, INPUT_FORMS, LAYOUTS, Case
from kit.engine.case_line import format_case, parse_case
from kit.engine.catalog import CASE_SETS
from kit.engine.draws import SIZES, Drawing, Takes, around
from kit.engine.features import FEATURES
from kit.engine.modes.mixed import decode_rows
from kit.fuzz.search import Finding, Target, first_failure, shrink, shrink_features
from kit.fuzz.strategies import any_case
from kit.harness.capabilities import Capabilities
from kit.engine.profile import SGLANG, SGLANG_BATCH_SIZES as BS_BUCKETS, SGLANG_TOKEN_BUCKETS as TOKEN_BUCKETS
from kit.engine.schedule import batches
from kit.modes import EXECS, MODES, Exec, ForwardMode
from tests.toys.planted import ZeroRowBeforeFullPage, triggered

PLANTED = "tests.toys.planted:ZeroRowBeforeFullPage"
SMALL = SIZES["small"]
# The CI budget the planted bug must be found within, in cases (a count: the seed makes the search
# the same everywhere, however busy the machine); the seconds only stop a search gone wrong.
SEARCH_EXAMPLES, SEARCH_SECONDS = 40, 600


def _draw(n: int, at: int = 0, takes: Takes = Takes(SGLANG), size: str = "small", modes=MODES):
    drawn = []

    @seed(at)
    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(any_case(modes, size, takes))
    def collect(case):
        drawn.append(case)

    collect()
    return drawn


def test_drawn_cases_are_valid_and_cover_every_feature():
    """Every drawn case is a Case (validated on construction) and reads back from its line; together they
    reach every mode, layout, dtype, page size, the graph buckets' batch sizes, page-boundary lengths and
    windows, caps, scales, trees, hybrid layers, MLA, sparse MLA, fused QKV inputs, sinks and EXTEND token counts at the
    token buckets, MIXED decode rows, draft decode chains and trees."""
    drawn = _draw(400)
    assert all(isinstance(c, Case) and parse_case(format_case(c)) == c for c in drawn)
    seen = lambda f: {f(c) for c in drawn}  # noqa: E731
    assert seen(lambda c: c.mode) == set(MODES)
    assert seen(lambda c: c.layout) == set(LAYOUTS) and seen(lambda c: c.dtype) == set(DTYPES)
    assert seen(lambda c: c.page) == set(SMALL.pages)
    assert set(around(BS_BUCKETS, 1, SMALL.max_bs)) <= seen(lambda c: c.bs)
    def boundaries(values_of):  # -1, 0, +1 for a value at k * page - 1, k * page, k * page + 1 (page > 1)
        return {(n + 1) % c.page - 1 for c in drawn if c.page > 1 for n in values_of(c)
                if n >= c.page - 1 and (n + 1) % c.page <= 2}

    assert boundaries(lambda c: c.prefix) == {-1, 0, 1} and {0, 1} <= {n for c in drawn for n in c.prefix}
    assert boundaries(lambda c: [c.window]) == {-1, 0, 1} and -1 in seen(lambda c: c.window)
    assert any(c.cap > 0 for c in drawn) and any(c.scale is not None for c in drawn) and any(c.hybrid for c in drawn)
    assert any(c.topk > 1 for c in drawn) and any(c.topk == 1 for c in drawn if c.mode is ForwardMode.TARGET_VERIFY)
    assert any(c.is_mla for c in drawn) and any(not c.is_mla for c in drawn)
    sparse = [c for c in drawn if c.kind == "sparse_mla"]
    assert {c.index_scatter for c in sparse} == {False, True} and any(c.kind == "mla" for c in drawn)
    assert any(c.index_topk > max(c.prefix) + sum(c.new_lens) for c in sparse)  # k past every context
    assert any(c.index_topk < max(c.prefix) for c in sparse)
    assert seen(lambda c: c.inputs) == set(INPUT_FORMS)
    assert any(c.sinks for c in drawn) and any(not c.sinks for c in drawn if not c.is_mla)
    extend_totals = {sum(c.new_lens) for c in drawn if c.mode is ForwardMode.EXTEND}
    assert extend_totals & set(around(TOKEN_BUCKETS, 1, SMALL.max_tokens))
    # MIXED: decode rows after extend rows, one or several; draft decode and draft extend trees whose draft
    # count is not their steps + 1, draft decode chains past two steps
    assert {decode_rows(c.new) > 1 for c in drawn if c.mode is ForwardMode.MIXED} == {False, True}
    for mode in (ForwardMode.DRAFT_EXTEND_V2, ForwardMode.DRAFT_DECODE):
        assert any(c.topk > 1 and c.steps + 1 != c.new for c in drawn if c.mode is mode), mode
    assert any(c.topk == 1 and c.new > 3 for c in drawn if c.mode is ForwardMode.DRAFT_DECODE)
    assert seen(lambda c: c.context_edge) == {False, True}


def test_drawn_cases_stay_within_what_the_backend_declares():
    """An MLA-only backend that reads no quantized cache gets MLA cases of every latent width, none
    with an fp8 cache or sinks (not a stream of rejected draws); a dense one no MLA, and only the
    quantized caches it names."""
    mla_only = _draw(100, takes=Takes(SGLANG, kinds=frozenset({"mla"}), kv_dtypes=frozenset(), features=frozenset()))
    assert all(c.is_mla and c.kv_dtype is None and not c.sinks for c in mla_only)
    assert {(c.kv_lora_rank, c.rope_dim) for c in mla_only} == set(SMALL.mla)
    dense = _draw(100, takes=Takes(SGLANG, kinds=frozenset({"dense"}), kv_dtypes=frozenset({"fp8_e5m2"})))
    assert not any(c.is_mla for c in dense) and {c.kv_dtype for c in dense} == {None, "fp8_e5m2"}
    assert any(c.sinks for c in dense)


def test_drawn_batch_sizes_and_token_counts_target_the_backends_engine():
    """A vLLM backend's cases are drawn at and around vLLM's capture sizes (24, 40, 48, 56 requests),
    which SGLang's buckets (powers of two) never name, so its padded graph rows appear at the sizes
    its engine captures; its EXTEND token totals are drawn around vLLM's token buckets likewise."""
    vllm = Takes.of(Capabilities.of(VllmTritonAttnBackend))
    large = SIZES["large"]
    vllm_only = set(around(vllm.profile.batch_sizes, 1, large.max_bs)) - set(around(BS_BUCKETS, 1, large.max_bs))
    assert {24, 40, 48, 56} <= vllm_only
    hits = {takes.profile.name: [c.bs for c in _draw(400, takes=takes, size="large", modes=(ForwardMode.DECODE,))
                                 if c.bs in vllm_only] for takes in (vllm, Takes(SGLANG))}
    assert len(hits["vllm"]) > 2 * len(hits["sglang"]) and len(set(hits["vllm"])) > len(set(hits["sglang"])), hits
    drawing = lambda takes: Drawing(large, ForwardMode.EXTEND, takes, {})  # noqa: E731
    assert drawing(vllm).token_buckets == vllm.profile.token_buckets != drawing(Takes(SGLANG)).token_buckets


def test_every_catalog_case_reads_back_from_its_line():
    for mode in MODES:
        for case in CATALOG.all_cases(mode).values():
            assert parse_case(format_case(case)) == case


@pytest.mark.parametrize("line, words", [
    ('Case("x", mode=ForwardMode.DECODE, prefix=(1,), page=__import__("os"))', "is not a literal"),
    ('Case("x", mode=ForwardMode.DECODE, prefix=(1,), new=2)', "exactly one new token"),
    ('Case("x", mode=ForwardMode.NOSUCH, prefix=(1,))', "no ForwardMode.NOSUCH"),
    ('print("x")', "not a Case(...) line"),
])
def test_a_bad_case_line_is_refused(line, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_case(line)


def test_no_catalog_case_reaches_the_planted_bug():
    """The planted bug's condition holds in no batch of any run of the catalog (both sets, every exec):
    the whole catalog passes it (README, Fuzzing: the full catalog run on CPU)."""
    reached = [b.name for mode in MODES for s in CASE_SETS for case in CATALOG.cases(s, mode) for ex in EXECS
               for b in batches(case, ex, SGLANG) if b.mode is ForwardMode.DECODE and triggered(b.prefix, b.page)]
    assert not reached


def test_a_found_failure_drops_every_feature_it_does_not_need():
    """A window bug found on a case with every feature on shrinks to the window alone: no cap, scale,
    sinks, fp8 cache, hybrid layers, fused inputs or page layout, and it still fails the same way."""
    busy = Case("gqa_bs2_window_cap_scale_hybrid_fused_sinks_p4_fp32_fp8_e4m3_nonmono", ForwardMode.DECODE,
                prefix=(9, 20), page=4, heads=(4, 2), head_dim=16, dtype="fp32", window=4, cap=5.0, scale=0.25,
                hybrid=True, inputs="fused_qkv", sinks=True, kv_dtype="fp8_e4m3", layout="non_monotonic_extend")
    target = Target("tests.toys.planted:WindowOneShort", (ForwardMode.DECODE,), (Exec.EAGER,), device="cpu")
    shrunk = shrink_features(target, Finding(busy, "eager", "kernel", "", ""))
    case = shrunk.case
    assert shrunk.failure_class == "kernel" and case.window == 4, format_case(case)
    assert (case.cap, case.scale, case.sinks, case.kv_dtype, case.hybrid, case.inputs, case.layout) == (
        0.0, None, False, None, False, "contiguous", "contiguous"), format_case(case)
    assert "_window_" in case.name and not any(f in case.name for f in ("cap", "sinks", "fp8", "nonmono"))
    assert shrunk.line == format_case(case) and "--case-line" in shrunk.repro


def test_a_failing_run_shrinks_to_the_fewest_requests_and_shortest_lengths_that_fail_the_same_way():
    """A window bug on three long requests with a cap shrinks to one shorter request without the cap;
    a bug that needs two neighbouring requests (an empty one before a full page) keeps both, at the
    shortest lengths that still trigger it."""
    window = Target("tests.toys.planted:WindowOneShort", (ForwardMode.DECODE,), (Exec.EAGER,), device="cpu")
    busy = Case("gqa_bs3_window_cap_p4_fp32", ForwardMode.DECODE, prefix=(40, 9, 33), page=4, heads=(4, 2),
                head_dim=16, dtype="fp32", window=4, cap=5.0)
    found = first_failure(window, busy, Exec.EAGER)
    small = shrink(window, found)
    assert (found.failure_class, small.failure_class) == ("kernel", "kernel")
    assert small.case.bs == 1 and sum(small.case.prefix) < 40 and small.case.window == 4 and small.case.cap == 0.0, \
        small.line
    neighbours = Target(PLANTED, (ForwardMode.DECODE,), (Exec.EAGER,), device="cpu")
    case = Case("gqa_bs4_p4_fp32", ForwardMode.DECODE, prefix=(7, 0, 8, 3), page=4, heads=(4, 2), head_dim=16,
                dtype="fp32")
    small = shrink(neighbours, first_failure(neighbours, case, Exec.EAGER)).case
    assert small.prefix == (0, 4) and triggered(small.prefix, small.page), format_case(small)


def test_a_passing_run_has_no_failure_to_shrink():
    target = Target("torch_native", (ForwardMode.DECODE,), (Exec.EAGER,), device="cpu")
    assert first_failure(target, Case("gqa_bs2_p4_fp32", ForwardMode.DECODE, prefix=(7, 3), page=4, heads=(4, 2),
                                      head_dim=16, dtype="fp32"), Exec.EAGER) is None


def _fuzz(capsys, tmp_path, *extra):
    ledger = tmp_path / "ledger.jsonl"
    code = kit_main(["fuzz", "--backend", PLANTED, "--mode", "decode", "--seed", "1", "--database", "none",
                     "--device", "cpu", "--ledger", str(ledger), *extra])
    out = capsys.readouterr().out
    return code, out, [json.loads(line) for line in ledger.read_text().splitlines()]


def test_fuzzer_finds_the_planted_bug_and_shrinks_it_to_what_the_bug_needs(capsys, tmp_path):
    code, out, ledger = _fuzz(capsys, tmp_path, "--max-examples", str(SEARCH_EXAMPLES), "--budget", str(SEARCH_SECONDS),
                              "--shrink-budget", "600")
    assert code == 1, out
    [record] = ledger
    assert record["first_example"] <= SEARCH_EXAMPLES and record["shrunk"], record
    [failure] = record["new"]
    assert failure["failure_class"] == "kernel" and failure["known"] is None
    lines = [line.rstrip(",") for line in out.splitlines() if line.startswith("Case(")]
    assert lines == [failure["case_line"]], out  # one line, as printed, to paste into cases/
    case = parse_case(lines[0])
    smallest_page = min(p for p in SMALL.pages if p > 1)
    # No larger than the bug needs: two requests, nothing cached and one full page of the smallest size.
    assert (case.mode, case.prefix, case.page) == (ForwardMode.DECODE, (0, smallest_page), smallest_page), lines[0]
    assert case.heads == (min(SMALL.kv_heads),) * 2 and case.head_dim == min(SMALL.head_dims), lines[0]
    assert (case.window, case.cap, case.scale, case.hybrid, case.is_mla, case.sinks) == (
        -1, 0.0, None, False, False, False), lines[0]
    assert f"repro: {failure['repro']}" in out
    # The repro, as printed, re-runs exactly the shrunk case and fails the same way.
    repro = shlex.split(failure["repro"])
    assert repro[:4] == ["python", "-m", "kit", "run"] and repro[repro.index("--case-line") + 1] == lines[0]
    assert kit_main(repro[3:] + ["--device", "cpu", "--timeout", "0"]) == 1  # no time limit: its watchdog needs a real stderr
    assert "fail [kernel]" in capsys.readouterr().out


def test_a_known_failure_is_reported_by_its_id_not_as_new(capsys, tmp_path):
    known = tmp_path / "KNOWN_FAILURES.md"
    known.write_text("<!-- known-failures:begin -->\n| id | backend | mode | exec | case | device | class | mark | reason "
                     "| link |\n|--|--|--|--|--|--|--|--|--|--|\n"
                     f"| KF-7 | {ZeroRowBeforeFullPage.name} | decode | eager | * | * | kernel | xfail | planted "
                     "| tests/toys/planted.py |\n"
                     "<!-- known-failures:end -->\n")
    code, out, [record] = _fuzz(capsys, tmp_path, "--budget", str(SEARCH_SECONDS), "--max-examples", "12",
                                "--known-failures", str(known))
    assert code == 0 and record["new"] == [], out
    assert record["known"]["KF-7"]["count"] >= 1 and "known: KF-7 x" in out


@pytest.mark.parametrize("backend, execs, budget", [("torch_native", "eager", 6), ("triton", "eager,graph", 8),
                                                    ("backends.torch_sparse_mla:TorchSparseMLABackend", "eager", 6),
                                                    ("torch_native_linear", "eager", 6)])
def test_seeded_fuzz_of_an_in_box_backend_finds_nothing_new(capsys, tmp_path, backend, execs, budget):
    """CI's fuzz: each in-box backend, every mode, a fixed seed and a small budget on CPU."""
    code = kit_main(["fuzz", "--backend", backend, "--exec", execs, "--budget", str(budget), "--shrink-budget", "30",
                     "--seed", "0", "--database", "none", "--device", "cpu", "--ledger", str(tmp_path / "l.jsonl")])
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "l.jsonl").read_text())
    assert code == 0 and record["new"] == [], out
    assert record["examples"] >= 1, out


def test_a_mutant_that_takes_its_fuzz_process_down_is_found_as_a_crash_of_its_case(tmp_path):
    """The fuzz process keeps the case it is running on disk (kit.fuzz.in_flight): a backend that
    aborts it leaves that case behind, and the mutant table reads it as the crash the mutant was
    expected to cause, not as a mutant missed."""
    from kit.fuzz.mutants import row
    from kit.mutation import Mutant
    from kit.modes import Exec

    mutant = Mutant(99, "aborts_in_forward", "tests.toys.crashing:AbortsInForwardBackend", ("crash",),
                    (ForwardMode.DECODE,), (Exec.EAGER,), cpu=True)
    args = argparse.Namespace(budget=60.0, shrink_budget=None, size="small", max_examples=5, seed=1, device="cpu",
                              timeout=None, known_failures=None, ledger=str(tmp_path / "ledger.jsonl"))
    r = row(mutant, args)
    assert r["found"] and r["classes"] == ["crash"] and r["examples"] == 1, r
    assert parse_case(r["case_line"]).mode is ForwardMode.DECODE and "--case-line" in r["repro"], r
    assert r["error"].startswith("the process died running it (killed by SIGABRT (exit code -6)"), r["error"]


def test_the_next_fuzz_says_which_case_took_the_last_one_down(capsys, tmp_path):
    from kit.fuzz import in_flight

    running = tmp_path / "in-flight.json"
    in_flight.write(running, dict(backend="b", mode="decode", exec="eager", case_line="Case(...)",
                                  repro="python -m kit run ...", example=3, seconds=1.5))
    code = kit_main(["fuzz", "--backend", "torch_native", "--mode", "decode", "--exec", "eager", "--max-examples", "1",
                     "--database", "none", "--device", "cpu", "--ledger", str(tmp_path / "ledger.jsonl"),
                     "--in-flight", str(running)])
    err = capsys.readouterr().err
    assert code == 0 and "the fuzz process before this one died running b eager (example 3, 1.5 s into its " \
                          "search): Case(...); repro: python -m kit run ..." in err, err
    assert not running.exists()  # taken, and this search ended in its own time


def test_every_catalog_line_reads_as_a_case_line():
    """Each `C("name", ...)` line of cases/<mode>.py, with `Case` and its mode written out, is read
    back by --case-line as the catalog's case (its presets too: GPT_OSS, GQA_32_8, ...); lines that
    spread a dict (`**SMALL_MLA`) or compute a value (`tuple(range(...))`) are no case line."""
    read = 0
    for mode in MODES:
        path = Path(__file__).resolve().parent.parent / "cases" / f"{mode.value}.py"
        for call in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "C"):
                continue
            values = [*call.args, *(k.value for k in call.keywords)]
            if any(k.arg is None for k in call.keywords) or any(
                    isinstance(node, (ast.Call, ast.BinOp)) for v in values for node in ast.walk(v)):
                continue
            line = f"Case({ast.unparse(call)[2:-1]}, mode=ForwardMode.{mode.name})"
            assert parse_case(line) == CATALOG.find_case(mode, ast.literal_eval(call.args[0])), line
            read += 1
    assert read > 100


def test_the_kit_raising_on_a_drawn_case_is_a_finding_of_class_kit_error(monkeypatch):
    """Not the backend's failure: a record of outcome error and class kit-error (the record's
    vocabulary, kit.report.record), still reported as new so that the kit's bug is seen."""
    from kit.fuzz import search
    from kit.report.record import ERROR_CLASSES, KIT_ERROR

    def raises(run, timeout, device):
        raise IndexError("the kit's own bug")
    monkeypatch.setattr(search, "dispatch", raises)
    outcome = search.fuzz(search.Target("torch_native", (ForwardMode.DECODE,), (EXECS[0],), device="cpu"),
                          budget=60, seed=1, shrink_budget=0, max_examples=3)
    assert KIT_ERROR in ERROR_CLASSES
    assert {f.failure_class for f in outcome.new} == {KIT_ERROR}, outcome
    assert "the kit raised IndexError: the kit's own bug" in outcome.new[0].message


def test_drawn_cases_reach_every_value_of_every_feature():
    """The draws reach each value of each case feature (kit.engine.features), the pairs check's too: the
    engines' row orders apart, a window starting on a page's last slot, sparse MLA's -1 padding after or
    among its indices, queries seeing fewer keys than the top-k and more (the recurrent kinds' features:
    tests/test_fuzz_recurrent.py)."""
    drawn = _draw(400)
    drawable = lambda f, value: f.name != "page" or value in SMALL.pages  # noqa: E731 - the size's pages
    missing = [(f.name, value) for f in FEATURES if f.case is Case for value in f.values
               if drawable(f, value) and not any(f.of(c) == value for c in drawn)]
    assert not missing, missing
