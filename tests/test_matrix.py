"""The matrix and its gate: each condition planted, each caught with a one-line message."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cases import CATALOG as catalog
from kit.report.known_failures import COLUMNS, KnownFailuresError, covering, load, match, of_backend, parse
from kit.modes import ForwardMode
from kit.report.record import Record
from kit.report.results import write_results
from matrix import fuzz, gate, readme
from matrix.table import Notes, cell, render, summary
from tests.helpers import once_per_session

REPO = Path(__file__).resolve().parent.parent
KF_HEADER = (REPO / "KNOWN_FAILURES.md").read_text().split("<!-- known-failures:begin -->")[0]
SMOKE_DECODE = [c.name for c in catalog.matrix_cases("smoke", ForwardMode.DECODE)]  # every run the matrix selects
# The toy backends are dense, without sinks or an fp8 KV cache: the smoke set's MLA, sinks and fp8 cases
# read unsupported for them.
DENSE_SMOKE_DECODE = [c.name for c in catalog.cases("smoke", ForwardMode.DECODE)
                      if not c.kv_lora_rank and not c.sinks and c.kv_dtype is None]


def kf_text(*rows: str) -> str:
    return (KF_HEADER + "<!-- known-failures:begin -->\n| id | backend | mode | exec | case | device | class | mark | reason | link |\n"
            "|----|----|----|----|----|----|----|----|----|----|\n" + "".join(r + "\n" for r in rows)
            + "<!-- known-failures:end -->\n")


def record(case, outcome="pass", cls=None, backend="be", mode="decode", exec_="eager", device="CPU (x86_64)",
           **kw) -> Record:
    return Record(backend=backend, mode=mode, exec=exec_, case=case, dtype="fp32", outcome=outcome, failure_class=cls,
                  device=device, versions=dict(torch="2.13.0", cuda="none", triton="3.9.0"), kit_commit="abc",
                  date="2026-11-22", repro="python -m kit run ...", **kw)


def rec(*args, **kw) -> dict:
    """A record as a results file holds it."""
    return record(*args, **kw).to_dict()


def write_fresh(path, records, selected=None, status="complete"):
    """A fresh results file as the plugin writes it: what the session selected, and how it ended."""
    ids = [f"{r['backend']}-{r['mode']}-{r['exec']}-{r['case']}" for r in records]
    write_results(path, records, run=dict(status=status, selected=ids if selected is None else selected,
                                          catalog=ids if selected is None else selected))


@pytest.fixture
def project(tmp_path):
    """A README, KNOWN_FAILURES.md and results/ in a temp dir, with tables written."""
    (tmp_path / "results").mkdir()
    write_results(tmp_path / "results" / "cpu.json", [rec("a"), rec("b"), rec("c", "fail", "kernel")])
    (tmp_path / "KNOWN_FAILURES.md").write_text(kf_text("| KF-1 | be | decode | eager | c | * | kernel | xfail | why | tests/toys |"))
    (tmp_path / "results" / "mutation").mkdir()
    (tmp_path / "results" / "mutation" / "gpu.json").write_text(json.dumps(dict(
        environment=dict(device="GPU X", versions=dict(torch="2.11", triton="3.6"), kit_commit="abc", date="2026-11-22"),
        case_set="full", scores=[dict(number=1, mutant="m1", expect=["graph"], harmless="", runs=4, failed=3,
                                      classes={"graph": 3}, first_failure="m1-decode-graph-c", repro="",
                                      not_run=0, caught=True)])))
    (tmp_path / "results" / "fuzz").mkdir()
    (tmp_path / "results" / "fuzz" / "mutants-gpu.json").write_text(json.dumps(dict(
        environment=dict(device="GPU X", kit_commit="abc", date="2026-11-22"), budget=30, shrink_budget=30,
        size="small", seed=0, rows=[dict(number=7, mutant="m7", expect=["kernel"], modes=["decode"], execs=["eager"],
                                         found=True, error="", examples=12, seconds=3.5, classes=["kernel"],
                                         case_line='Case("c", mode=ForwardMode.DECODE, prefix=(3,))')])))
    (tmp_path / "README.md").write_text(f"# x\n\n{readme.SUMMARY_BEGIN}\n{readme.SUMMARY_END}\n\n{readme.BEGIN}\n{readme.END}\n\n{readme.MUTANTS_BEGIN}\n"
                                        f"{readme.MUTANTS_END}\n\n{fuzz.BEGIN}\n{fuzz.END}\n\ntail\n")
    p = dict(readme_path=tmp_path / "README.md", known_path=tmp_path / "KNOWN_FAILURES.md",
             results_dir=tmp_path / "results")
    run_matrix("write", p)
    return p


def run_matrix(command, p, *extra):
    return subprocess.run([sys.executable, "-m", "matrix", command, "--readme", str(p["readme_path"]),
                           "--known-failures", str(p["known_path"]), "--results-dir", str(p["results_dir"]), *extra],
                          cwd=REPO, capture_output=True, text=True)


def test_clean_project_passes_the_gate(project):
    """Tables written from the results, the known failure covering the only failure: check is green."""
    proc = run_matrix("check", project)
    assert proc.returncode == 0, proc.stderr
    text = project["readme_path"].read_text()
    assert "✓ 2/3, xfail 1/3 (KF-1)" in text and text.endswith("tail\n")


def test_write_is_deterministic(project):
    first = project["readme_path"].read_text()
    run_matrix("write", project)
    assert project["readme_path"].read_text() == first


def test_stale_table_is_caught(project):
    """A hand-edited cell fails the gate, naming the difference."""
    path = project["readme_path"]
    path.write_text(path.read_text().replace("✓ 2/3", "✓ 3/3"))
    proc = run_matrix("check", project)
    assert proc.returncode == 1
    assert "matrix tables differ from the results" in proc.stderr and "✓ 3/3" in proc.stderr


@pytest.mark.parametrize("what, row, edit, shown", [
    ("mutation tables", "| 1 | `m1` | graph | 3/4 | graph 3 |", ("| 3/4 |", "| 4/4 |"), "4/4"),
    ("fuzz mutant tables", "| 7 | `m7` | decode · eager | kernel | 12 examples, 3.5 s |", ("12 examples", "2 examples"),
     "| 2 examples"),
], ids=["mutation", "fuzz"])
def test_stale_generated_table_is_caught(project, what, row, edit, shown):
    """The mutation scores (results/mutation/) and the fuzzer's mutant tables (results/fuzz/) are written
    from their files, and a hand edit fails the gate."""
    path = project["readme_path"]
    assert row in path.read_text()
    path.write_text(path.read_text().replace(*edit))
    proc = run_matrix("check", project)
    assert proc.returncode == 1
    assert f"{what} differ from the results" in proc.stderr and shown in proc.stderr


def test_uncovered_failure_is_caught(project, tmp_path):
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("b", "fail", "graph"), rec("c", "fail", "kernel")])
    problems = gate.check(**project, fresh_paths=[str(fresh)])
    assert any(p.startswith("uncovered failure: be-decode-eager-b [graph]") for p in problems), problems


def test_known_failure_with_another_class_is_uncovered(project, tmp_path):
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("b"), rec("c", "fail", "kv-write")])
    problems = gate.check(**project, fresh_paths=[str(fresh)])
    assert any("uncovered failure: be-decode-eager-c [kv-write]" in p for p in problems), problems


def test_known_failure_that_now_passes_is_caught(project, tmp_path):
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("b"), rec("c")])
    problems = gate.check(**project, fresh_paths=[str(fresh)])
    assert any("stale known failure: KF-1" in p and "now passes for be-decode-eager-c" in p for p in problems)


def test_entry_matching_only_unsupported_runs_is_caught(project, tmp_path):
    """An entry whose runs are all unsupported can never fail: stale."""
    project["known_path"].write_text(kf_text(
        "| KF-1 | be | decode | eager | c | * | kernel | xfail | why | tests/toys |",
        "| KF-2 | be | decode | eager | d | * | graph | xfail | why | tests/toys |"))
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("b"), rec("c", "fail", "kernel"), rec("d", "unsupported")])
    problems = gate.check(**project, fresh_paths=[str(fresh)])
    assert any("stale known failure: KF-2" in p and "matches no run" in p for p in problems), problems


def test_entry_no_result_can_judge_is_named_not_stale(project):
    """Results whose catalogs hold no run the entry matches (committed before its backend, mode or
    case existed, or narrowed to ci_cases) cannot judge it: not stale, and `matrix check` names it."""
    project["known_path"].write_text(kf_text(
        "| KF-1 | be | decode | eager | c | * | kernel | xfail | why | tests/toys |",
        "| KF-2 | be | extend | graph | nothing_* | * | graph | xfail | why | tests/toys |",
        "| KF-3 | other | decode | eager | c | * | graph | xfail | why | tests/toys |"))
    unjudged = []
    problems = gate.check(**project, unjudged=unjudged)
    assert not any("KF-2" in p or "KF-3" in p for p in problems), problems
    assert unjudged == ["KF-2", "KF-3"]


def test_malformed_line_names_file_line_and_fix(project):
    project["known_path"].write_text(kf_text("| KF-1 | be | decode | eagr | c | * | kernel | xfail | why | tests/toys |",
                                             "| KF-2 | be | decode | eager | c | * | kernel | xfail | why |"))
    proc = run_matrix("check", project)
    assert proc.returncode == 1
    lines = [l for l in proc.stderr.splitlines() if "KNOWN_FAILURES.md:" in l]
    assert len(lines) == 2
    assert "exec 'eagr' is not eager, graph or *" in lines[0] and "fix: write the row as" in lines[0]
    assert "expected 10 cells" in lines[1]
    with pytest.raises(KnownFailuresError, match=r"KNOWN_FAILURES.md:\d+: id 'K1'"):
        parse(kf_text("| K1 | be | decode | eager | c | * | kernel | xfail | why | tests/toys |"))


def test_entry_is_scoped_to_its_device():
    """A failure only the H100 shows: its entry covers the H100 record and not a CPU one."""
    entries = parse(kf_text("| KF-1 | be | decode | eager | c | *H100* | kernel | xfail | why | results/gpu-h100.json |"))
    gpu = record("c", "fail", "kernel", device="NVIDIA H100 80GB HBM3")
    assert covering(entries, gpu) is entries[0]
    assert covering(entries, record("c", "fail", "kernel")) is None
    assert match(entries, "be", "decode", "eager", "c", "CPU (x86_64)", "fp32") is None


def test_the_first_match_says_how_and_any_quarantine_match_isolates_whatever_the_order():
    """A run that fails as the first entry says (a wrong output, before the step that would fault)
    is judged by it, and still runs in a subprocess where a quarantine entry matches it too."""
    entries = parse(kf_text("| KF-1 | be | * | * | *fp8* | * | kernel | xfail | wrong | tests/toys |",
                            "| KF-2 | be | decode | eager | * | * | crash | quarantine | kills it | tests/toys |"))
    first = match(entries, "be", "decode", "eager", "c_fp8", "CPU (x86_64)", "fp16")
    assert (first.id, first.failure_class, first.mark) == ("KF-1", "kernel", "quarantine")
    assert match(entries, "be", "decode", "eager", "c", "CPU (x86_64)", "fp16").id == "KF-2"
    assert match(entries, "be", "extend", "eager", "c_fp8", "CPU (x86_64)", "fp16").mark == "xfail"


def test_a_case_pattern_names_a_dtype_after_at():
    """`*@fp32` matches every fp32 case, whatever its name says; a name pattern still matches the
    name alone."""
    entries = parse(kf_text("| KF-1 | be | * | * | *@fp32 | * | kernel | xfail | tf32 | tests/toys |",
                            "| KF-2 | be | * | * | c_bf16 | * | kernel | xfail | named | tests/toys |"))
    assert match(entries, "be", "decode", "eager", "mqa_p1", "CPU (x86_64)", "fp32").id == "KF-1"
    assert match(entries, "be", "decode", "eager", "mqa_p1", "CPU (x86_64)", "fp16") is None
    assert match(entries, "be", "decode", "eager", "c_bf16", "CPU (x86_64)", "bf16").id == "KF-2"
    assert covering(entries, record("mqa_p1", "fail", "kernel")).id == "KF-1"  # record()'s dtype: fp32


def test_a_case_cell_of_several_globs_matches_where_any_does():
    """One cause's runs named exactly by several globs, space-separated: a run matches where any glob
    does (its name or `name@dtype`), and no other run."""
    entries = parse(kf_text("| KF-1 | be | * | * | c_ragged* c_window *@fp16 | * | crash | xfail | one cause | tests/toys |"))
    for case, dtype in (("c_ragged", "bf16"), ("c_ragged_shuf", "bf16"), ("c_window", "bf16"), ("d", "fp16")):
        assert match(entries, "be", "extend", "eager", case, "CPU (x86_64)", dtype).id == "KF-1", case
    for case in ("c_window_shuf", "d", "c_rag"):
        assert match(entries, "be", "extend", "eager", case, "CPU (x86_64)", "bf16") is None, case


def test_a_glob_of_several_that_no_run_needs_is_stale(project):
    """Each glob of an entry of several is judged: one matching only unsupported runs, or none, is
    named (a glob left over would hide a later failure it was not meant for); each matching a
    failure is not."""
    write_results(project["results_dir"] / "cpu.json", [rec("a"), rec("b", "unsupported"), rec("c", "fail", "kernel"),
                                                          rec("d", "fail", "kernel")])
    project["known_path"].write_text(kf_text("| KF-1 | be | decode | eager | c d | * | kernel | xfail | why | tests/toys |"))
    assert not any("KF-1" in p for p in gate.check(**project))
    project["known_path"].write_text(kf_text("| KF-1 | be | decode | eager | c b d nothing_* | * | kernel | xfail | why | tests/toys |"))
    stale = [p for p in gate.check(**project) if "KF-1" in p]
    assert len(stale) == 2 and "its case pattern 'b' matches no run" in stale[0] and "'nothing_*'" in stale[1], stale


def test_a_backends_entries_match_its_runs_as_all_entries_do():
    """Collection matches each run against its backend's entries only (of_backend): for every run
    of the committed results, the same entry, and in a table whose first match is another
    backend's, still the backend's own."""
    entries = load(REPO / "KNOWN_FAILURES.md")
    records = [r for path in sorted((REPO / "results").glob("*.json")) for r in json.loads(path.read_text())["records"]]
    assert records and any(match(entries, r["backend"], r["mode"], r["exec"], r["case"], r["device"], r["dtype"]) for r in records)
    for r in records:
        run = (r["backend"], r["mode"], r["exec"], r["case"], r["device"], r["dtype"])
        assert match(of_backend(entries, r["backend"], r["device"]), *run) == match(entries, *run), run
    mixed = parse(kf_text("| KF-1 | other | * | * | * | * | kernel | xfail | theirs | tests/toys |",
                          "| KF-2 | b* | * | * | * | *H100* | crash | xfail | ours | tests/toys |"))
    assert [e.id for e in of_backend(mixed, "be", "NVIDIA H100 80GB HBM3")] == ["KF-2"]
    assert of_backend(mixed, "be", "CPU (x86_64)") == []


@pytest.mark.parametrize("link, ok", [("https://github.com/org/repo/issues/12", True), ("results/gpu-h100.json", True),
                                      ("backends/triton/kernels.py#L40", True), ("tests/toys", True),
                                      ("link", False), ("x", False), ("see issue 12", False), ("/etc/passwd", False)])
def test_link_must_look_like_one(link, ok):
    row = f"| KF-1 | be | decode | eager | c | * | kernel | xfail | why | {link} |"
    if ok:
        assert parse(kf_text(row))[0].link == link
    else:
        with pytest.raises(KnownFailuresError, match="is neither a URL nor a repo path"):
            parse(kf_text(row))


def test_link_cell_holds_a_thread_and_source_lines():
    thread, source = "https://github.com/org/repo/pull/7", "https://github.com/org/repo/blob/v1/a.py#L3"
    row = f"| KF-1 | be | decode | eager | c | * | kernel | xfail | why | {thread} {source} |"
    assert parse(kf_text(row))[0].links == [thread, source]
    with pytest.raises(KnownFailuresError, match="link 'issue' is neither"):
        parse(kf_text(row.replace(source, "issue")))


@pytest.mark.parametrize("thread, ids", [
    ("sgl-project/sglang/pull/32087", ("KF-1", "KF-2")),  # Triton decode keeps W keys
    ("sgl-project/sglang/pull/39287", ("KF-3", "KF-10", "KF-13", "KF-18"))])  # verify windows: index, misalignment
def test_shipped_entries_cite_the_thread_tracking_their_bug(thread, ids):
    entries = {e.id: e for e in parse((REPO / "KNOWN_FAILURES.md").read_text())}
    for kf in ids:
        links = entries[kf].links  # the thread, the source lines, then any standalone file (repro/)
        assert links[0] == f"https://github.com/{thread}" and "/blob/" in links[1], kf


def test_header_of_the_shipped_table_is_the_parsed_one():
    """KNOWN_FAILURES.md's own header row names the columns the parser reads, device included."""
    text = (REPO / "KNOWN_FAILURES.md").read_text()
    assert "| " + " | ".join(COLUMNS) + " |" in text
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| KF-")]
    assert [entry.id for entry in parse(text)] == rows  # every row parses, under that header


def test_a_fresh_file_that_cannot_be_read_is_the_answer_before_anything_is_read(project, tmp_path, monkeypatch):
    """`matrix check` took a minute to reject an empty file: it read and rendered the committed results first."""
    fresh = tmp_path / "fresh.json"
    fresh.write_text("")

    def read_nothing_else(*args):
        raise AssertionError("the committed results were read")
    monkeypatch.setattr(gate, "committed_files", read_nothing_else)
    monkeypatch.setattr(gate, "load", read_nothing_else)
    [problem] = gate.check(**project, fresh_paths=[str(fresh)])
    assert "fresh.json: not a results file (bad JSON" in problem, problem


def test_fresh_run_disagreeing_with_committed_results_is_caught(project, tmp_path):
    """The CPU table cannot lie: a fresh run must match the committed results of its device."""
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("c", "fail", "kernel")])
    problems = gate.check(**project, fresh_paths=[str(fresh)])
    assert any("be-decode-eager-b: committed results/cpu.json say pass, this run says not run" in p for p in problems)


def test_cells():
    notes = Notes()
    assert cell([record("a"), record("b")], [], notes) == "✓ 2/2"
    assert cell([record("a"), record("b", "fail", "graph"), record("c", "fail", "crash")], [], notes) == \
        "✗ 2/3 crash/graph, ✓ 1/3"
    assert cell([record("a", "unsupported", message="no capture hooks")] * 2, [], notes) == "— unsupported (1)"
    assert cell([record("a"), record("b", "unsupported", message="x")], [], notes) == "✓ 1/1, 1 unsupported (2)"
    assert cell([record("a", exec_="graph", exec_detail="emulated")], [], notes) == "✓ 1/1 (emulated)"
    entries = parse(kf_text("| KF-7 | * | * | * | b | * | crash | quarantine | faults | tests/toys |"))
    assert cell([record("a"), record("b", "fail", "crash", isolated=True)], entries, notes) == \
        "✓ 1/2, quarantine 1/2 (KF-7, subprocess)"
    xfail = parse(kf_text("| KF-8 | * | * | * | b | * | crash | xfail | fails alike in any process | tests/toys |"))
    assert cell([record("b", "fail", "crash", isolated=True)], xfail, notes) == "xfail 1/1 (KF-8)"  # own_process
    assert notes.block() == "- (1) no capture hooks\n- (2) x"


def test_the_pass_summary_counts_each_mode_of_a_backend_eager_and_graph_together():
    entries = parse(kf_text("| KF-2 | be | decode | graph | b | * | kernel | xfail | why | tests/toys |"), "KF")
    records = [record("a"), record("a", exec_="graph"), record("b", "fail", "kernel", exec_="graph"),
               record("c", "fail", "graph"), record("d", "unsupported", message="x"),
               record("a", mode="extend", outcome="unsupported", message="x")]
    text = summary({"r": records}, entries)
    row = next(line for line in text.splitlines() if line.startswith("| be"))
    assert [c.strip() for c in row.strip("|").split("|")][:3] == ["be", "2 · 1 · 1 · 1", "—"], row


def test_write_puts_each_block_where_its_markers_are(project, tmp_path):
    """The pass summary in the README, the per-case matrices on the generated page (--page)."""
    text = project["readme_path"].read_text()
    before, rest = text.split(readme.BEGIN, 1)
    project["readme_path"].write_text(before + rest.split(readme.END, 1)[1])
    page = tmp_path / "matrix.md"
    page.write_text(f"# matrices\n\n{readme.BEGIN}\n{readme.END}\n")
    proc = run_matrix("write", project, "--page", str(page))
    assert proc.returncode == 0, proc.stderr
    assert "xfail 1/3 (KF-1)" in page.read_text()
    assert "xfail" not in project["readme_path"].read_text() and "2 · 0 · 1 · 0" in project["readme_path"].read_text()
    assert run_matrix("check", project, "--page", str(page)).returncode == 0
    page.write_text(page.read_text().replace("xfail 1/3 (KF-1)", "✓ 3/3"))
    assert "the matrix tables differ" in run_matrix("check", project, "--page", str(page)).stderr


def test_a_cell_with_nothing_passing_shows_no_check_mark():
    entries = parse(kf_text("| KF-2 | * | * | * | * | * | kernel | xfail | why | tests/toys |"))
    assert cell([record("a", "fail", "kernel"), record("b", "fail", "kernel")], entries, Notes()) == "xfail 2/2 (KF-2)"
    assert cell([record("a", "fail", "graph")], [], Notes()) == "✗ 1/1 graph"


def test_a_reason_repeated_across_a_row_is_written_once():
    reason = "FlashInferAttnBackend runs on CUDA GPUs only; no CUDA device here " * 3
    records = [record(c, "unsupported", message=reason, mode=m.value, exec_=e, backend="gpu_only")
               for m in ForwardMode for e in ("eager", "graph") for c in "ab"] + [record("a")]
    text = render({"results/cpu.json": records}, [])
    assert text.count(reason) == 1
    row = next(line for line in text.splitlines() if line.startswith("| gpu_only"))
    assert "— unsupported (1)" in row and len(row) < 40 * 2 * len(ForwardMode)



def test_runs_stopped_by_their_environment_are_no_verdict():
    """An environment error (the kit out of device memory) is not counted against the backend."""
    stopped = record("b", "error", "environment", message="out of device memory in the kit's own allocations")
    assert cell([record("a"), stopped], [], Notes()) == "✓ 1/1, 1 not judged (environment)"
    assert cell([stopped], [], Notes()) == "1 not judged (environment)"


def test_gate_takes_no_results_with_runs_stopped_by_their_environment(project, tmp_path):
    """Neither as a fresh run (it is no pass, and it is not compared) nor as committed results."""
    fresh = tmp_path / "fresh.json"
    write_fresh(fresh, [rec("a"), rec("b", "error", "environment", message="out of device memory"),
                        rec("c", "fail", "kernel")])
    problems = gate.check(**project, fresh_paths=[str(fresh)])
    assert len(problems) == 1 and "1 runs stopped by their environment" in problems[0], problems
    assert "be-decode-eager-b: out of device memory" in problems[0] and "run them again" in problems[0]
    write_results(project["results_dir"] / "cpu.json", [rec("a"), rec("b", "error", "environment"),
                                                        rec("c", "fail", "kernel")])
    problems = gate.check(**project)
    assert any("partial results: 1 runs stopped by their environment" in p for p in problems), problems

# -------------------------------------------------- the suite itself: strict xfail, quarantine, dead workers


def suite_records(tmp_path, backends, kf_rows=(), *extra):
    """The conformance suite on the smoke decode cases of `backends`, in a pytest process of its own:
    the process, and the records of its results file by backend (as named with --backend), then by
    case/exec."""
    kf = tmp_path / "KF.md"
    kf.write_text(kf_text(*kf_rows))
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-p", "no:cacheprovider",
                           "-q", "-rxX", *[a for b in backends for a in ("--backend", b)], "--mode", "decode",
                           "--case-set", "smoke", "--known-failures", str(kf), "--results-json", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True)
    records = json.loads(out.read_text())["records"] if out.exists() else []
    by_backend = {b: {} for b in backends}
    for r in records:
        repro = shlex.split(r["repro"])
        by_backend[repro[repro.index("--backend") + 1]][r["case"] + "/" + r["exec"]] = r
    return proc, by_backend


def run_suite(tmp_path, backend, kf_rows=(), *extra):
    proc, by_backend = suite_records(tmp_path, [backend], kf_rows, *extra)
    return proc, by_backend[backend]


STALE = "tests.toys.dense:StaleReplayBackend"


HARD_CRASH = "tests.toys.crashing:HardCrashBackend"


def known_failures_session(tmp_path_factory):
    """One session of two backends, each with its known failure: the stale replay's graph runs
    (xfail) and the hard crash's one case (quarantine; the backend has no graph runs), with progress
    lines; the tests that only read what a narrowed, complete session prints and writes read it too:
    (process, records by backend, folder)."""
    return once_per_session(tmp_path_factory, "known_failures", lambda folder: suite_records(folder, [STALE, HARD_CRASH], [
        "| KF-1 | toy_stale_replay | decode | graph | * | * | graph | xfail | replay keeps capture metadata | tests/toys |",
        "| KF-2 | toy_hard_crash | decode | eager | mqa_p1_shuf | * | crash | quarantine | kills the process | tests/toys |"],
        "--progress-every", "0.001"))


@pytest.fixture
def known_failures_suite(tmp_path_factory):
    return known_failures_session(tmp_path_factory)


@pytest.fixture
def mismatched_known_failures_suite(tmp_path_factory):
    """One session of the stale replay under entries that do not hold here: one claims a passing run
    fails (a strict XPASS), one names the wrong class, one is for another device only: the process."""
    return once_per_session(tmp_path_factory, "mismatched_known_failures", lambda folder: suite_records(folder, [STALE], [
        "| KF-1 | toy_stale_replay | decode | eager | gqa_bf16_p16 | * | kernel | xfail | claims eager fails | tests/toys |",
        "| KF-2 | toy_stale_replay | decode | graph | gqa_bf16_p16 | * | kernel | xfail | wrong class | tests/toys |",
        "| KF-3 | toy_stale_replay | decode | * | * | *No Such Device* | graph | xfail | elsewhere only | tests/toys |"]))[0]


def xfailed(proc, backend):
    """The -rxX lines of the runs of `backend` that xfailed."""
    return [line for line in proc.stdout.splitlines() if line.startswith("XFAIL ") and f"[{backend}-" in line]


def test_known_failures_become_strict_xfails(known_failures_suite, mismatched_known_failures_suite):
    """Matching failures xfail; a matching pass (XPASS strict) and a class mismatch fail the run."""
    proc, by_backend, _ = known_failures_suite
    records = by_backend[STALE]
    assert proc.returncode == 0, proc.stdout[-2000:]
    lines = xfailed(proc, "toy_stale_replay")
    assert len(lines) == len(DENSE_SMOKE_DECODE) and all("-graph-" in l and " - KF-1" in l for l in lines), lines
    assert all(records[f"{c}/graph"]["failure_class"] == "graph" for c in DENSE_SMOKE_DECODE)

    proc = mismatched_known_failures_suite
    assert proc.returncode == 1
    assert "XPASS(strict)" in proc.stdout and "KF-1" in proc.stdout
    assert "not the known failure: KF-2 (" in proc.stdout and "expects [kernel] here, this run failed [graph]" in proc.stdout


def test_quarantined_failure_runs_in_a_subprocess(known_failures_suite):
    """A quarantine entry keeps the crash out of the test process: no worker dies, the case xfails."""
    proc, by_backend, _ = known_failures_suite
    assert proc.returncode == 0, proc.stdout[-2000:]
    r = by_backend[HARD_CRASH]["mqa_p1_shuf/eager"]
    assert r["isolated"] and r["failure_class"] == "crash" and "exit code 3" in r["message"]
    lines = xfailed(proc, "toy_hard_crash")
    assert len(lines) == 1 and "[toy_hard_crash-decode-eager-mqa_p1_shuf]" in lines[0] and " - KF-2" in lines[0], lines


def test_entry_for_another_device_does_not_xfail_here(mismatched_known_failures_suite):
    """An entry scoped to another device leaves this device's runs alone: they fail as plain
    failures here, and a pass here is no strict XPASS (the one strict XPASS is KF-1's, on this device)."""
    proc = mismatched_known_failures_suite
    assert proc.returncode == 1
    assert "xfailed" not in proc.stdout and "KF-3" not in proc.stdout, proc.stdout[-1500:]
    xpassed = [line for line in proc.stdout.splitlines() if "XPASS" in line]
    assert len(xpassed) == 1 and "KF-1" in xpassed[0], xpassed
    # every graph run (KF-2's wrong class among them) and KF-1's strict XPASS
    assert f"{len(DENSE_SMOKE_DECODE) + 1} failed" in proc.stdout, proc.stdout[-1500:]


def test_interrupted_run_keeps_what_finished(tmp_path):
    """Killed mid-run (here: hard, during the 2nd case), the results file holds the finished case, whole."""
    out = tmp_path / "results.json"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-p", "no:cacheprovider",
                             "-q", "--backend", "tests.toys.crashing:HangBackend", "--mode", "decode", "--exec",
                             "eager", "--case-set", "smoke", "--results-json", str(out)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and json.loads(out.read_text())["records"]) and time.monotonic() < deadline:
            time.sleep(0.2)  # the file exists from the first run on; wait for the first record
        assert out.exists(), "no results written while the run was going"
    finally:
        proc.kill()
        proc.wait()
    doc = json.loads(out.read_text())
    records = doc["records"]
    assert [r["case"] for r in records] == [DENSE_SMOKE_DECODE[0]] and records[0]["outcome"] == "pass"
    assert doc["run"]["status"] == "running", "a killed run's file says it never finished"


def test_matrix_check_runs_without_torch(project):
    """The report layer never loads the engine: `python -m matrix check` with torch unimportable."""
    code = ("import sys, runpy\n"
            "sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"
            f"sys.argv = ['matrix', 'check', '--readme', {str(project['readme_path'])!r},"
            f" '--known-failures', {str(project['known_path'])!r}, '--results-dir', {str(project['results_dir'])!r}]\n"
            "try:\n    runpy.run_module('matrix', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert sys.modules['torch'] is None\n"
            "assert not [m for m in sys.modules if m.startswith(('kit.harness.runner', 'kit.harness.graph', 'kit.engine.fixture'))]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_pass_under_declared_numerics_has_its_own_mark_and_legend():
    from matrix.table import DECLARED_LEGEND, device_table
    records = [record("a", numerics="exact"), record("b", numerics="q fp8, p fp8"), record("c")]
    assert cell(records, [], Notes()) == "✓ 2/3, ≈ 1/3"
    assert DECLARED_LEGEND in device_table("CPU", records, [], "x")
    assert DECLARED_LEGEND not in device_table("CPU", [record("a", numerics="exact")], [], "x")


def test_a_failure_outside_its_entrys_band_is_uncovered(project, tmp_path):
    """A second bug where a known failure already fails: the entry pins its band, the record leaves it."""
    write_results(project["results_dir"] / "cpu.json", [rec("a"), rec("b"), rec("c", "fail", "kernel", margins=[40.0, 1.0])])
    project["known_path"].write_text(kf_text("| KF-1 | be | decode | eager | c | * | kernel 1.5-4x | xfail | why | tests/toys |"))
    run_matrix("write", project)
    result = run_matrix("check", project)
    assert result.returncode == 1 and "uncovered failure: be-decode-eager-c [kernel]" in result.stderr
    write_results(project["results_dir"] / "cpu.json", [rec("a"), rec("b"), rec("c", "fail", "kernel", margins=[3.0, 1.0])])
    run_matrix("write", project)
    assert run_matrix("check", project).returncode == 0


def test_check_names_records_near_the_line(project):
    write_results(project["results_dir"] / "cpu.json", [rec("a", margins=[0.1, 0.6]), rec("b", margins=[0.2, 0.3]),
                                                        rec("c", "fail", "kernel", margins=[1.9, 0.1])])
    run_matrix("write", project)
    result = run_matrix("check", project)
    assert result.returncode == 0, result.stderr
    assert "near the line (2 records" in result.stdout and "be-decode-eager-a (0.6x)" in result.stdout
    assert "be-decode-eager-c (1.9x)" in result.stdout and "eager-b" not in result.stdout
