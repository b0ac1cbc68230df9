"""`--shard K/N` over machines: the split (stable, disjoint, covering, whole kernel groups, the same
for the matrix and its warmup) and the merge (one run from its shards; a missing, doubled,
narrowed or disagreeing shard refused in one line, by `matrix merge`, `check` and `write`)."""
import json
import os
import random
import re
import shlex
import subprocess
import sys

import pytest

import kit.__main__ as kit_cli
from kit.cli import USAGE
from kit import warmup
from kit.engine.catalog import load_catalog
from kit.modes import EXECS, MODES
from kit.plugin.selection import Selection, group_of
from kit.report.record import Record, Rerun, ResultsError, ResultsFile, read_results_file, run_id
from kit.report.results import write_results
from kit.shard import Shard, split
from matrix import gate
from matrix import __main__ as matrix_cli
from matrix.committed import committed_text
from matrix.merge import RerunError, ShardsError, merge
from tests.test_matrix import REPO, kf_text, project, rec, run_matrix, write_fresh  # noqa: F401

LABELS = {"torch_native": "torch_native", "tests.toys.dense:DenseGraphBackend": "toy_dense"}  # a spec not its label


def _selection(shard=None, ci_cases=None):
    catalog = load_catalog()
    return Selection(labels=LABELS, modes=list(MODES), execs=list(EXECS), catalog_target=None, known=[],
                     _load=lambda: (catalog, "smoke", dict.fromkeys(LABELS, None) | (ci_cases or {})), shard=shard)


# ------------------------------------------------------------------------------------------ the split


def test_shard_is_parsed_from_k_of_n_and_nothing_else():
    assert Shard.parse("2/3") == Shard(2, 3) and str(Shard(2, 3)) == "2/3"
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/2", "1/2/3"):
        with pytest.raises(ValueError, match="give K/N with 1 <= K <= N"):
            Shard.parse(bad)


def test_the_split_is_the_same_in_any_order():
    """Every machine collects in its own order: the split depends on the groups alone."""
    groups = [f"be{b}-decode-v{v}" for b in range(3) for v in range(7) for _ in range(1 + v % 3)]
    first = split(groups, 4)
    for seed in range(5):
        random.Random(seed).shuffle(groups)
        assert split(groups, 4) == first
    assert set(first.values()) == {1, 2, 3, 4}


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_shards_are_disjoint_cover_the_selection_and_keep_kernel_groups_whole(count):
    whole = [run.id for run in _selection().product()]
    parts = [[run for run in _selection(Shard(k, count)).runs()] for k in range(1, count + 1)]
    ids = [run.id for part in parts for run in part]
    assert sorted(ids) == sorted(whole) and len(ids) == len(set(ids))  # each run in exactly one shard
    shard_of_group = {}
    for k, part in enumerate(parts, 1):
        for run in part:
            assert shard_of_group.setdefault(group_of(run), k) == k, f"{group_of(run)} split over shards"
    sizes = [len(part) for part in parts]
    largest_group = max(sum(1 for run in _selection().product() if group_of(run) == g) for g in shard_of_group)
    assert max(sizes) - min(sizes) <= largest_group, sizes  # balanced to within one group
    for part in parts:  # each shard runs in the product's order (batches shared by a case's execs)
        assert [run.id for run in part] == [i for i in whole if i in {run.id for run in part}]


def test_ci_cases_narrow_a_shard_but_not_its_split():
    """A backend's ci_cases (CPU, `--case-set auto`) leave out runs, not groups: the split, which
    warmup computes without them, stays the same."""
    first = load_catalog().cases("smoke", MODES[0])[0].name
    narrowed = {"torch_native": {MODES[0].value: [first]}}
    for k in (1, 2):
        plain = {run.id for run in _selection(Shard(k, 2)).runs()}
        ci = {run.id for run in _selection(Shard(k, 2), narrowed).runs()}
        kept = {f"torch_native-{MODES[0].value}-{e.value}-{first}" for e in EXECS}
        assert ci == {i for i in plain if not i.startswith("torch_native-") or i in kept}


def test_a_shards_warmup_builds_the_kernel_groups_its_matrix_runs():
    catalog = load_catalog()
    for k in (1, 2, 3):
        shard = Shard(k, 3)
        matrix = {(run.spec, run.case.mode, run.case.kernel_variant) for run in _selection(shard).runs()}
        todo = warmup.builds(list(LABELS), list(MODES), list(EXECS), catalog, "smoke", shard=shard, label_of=LABELS.get)
        assert {(b.backend, b.case.mode, b.case.kernel_variant) for b in todo} == matrix, k


def test_warmup_takes_shard_from_its_command_line(monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(warmup, "warmup", lambda todo, *args: asked.append(todo) or 0)
    argv = ["warmup", "--backend", ",".join(LABELS), "--case-set", "smoke", "--mode", "decode"]
    assert kit_cli.main(argv) == 0 and kit_cli.main(argv + ["--shard", "2/2"]) == 0
    whole, second = asked
    sel = _selection(Shard(2, 2))
    sel.modes = [MODES[0]]
    runs = {(r.spec, r.case.kernel_variant) for r in sel.runs() if warmup.runs_here(r.spec, r.case, r.exec_)}
    assert {(b.backend, b.case.kernel_variant) for b in second} == runs  # the builds of the cases the backends run
    assert 0 < len(second) < len(whole)
    assert kit_cli.main(argv + ["--shard", "3/2"]) == USAGE
    assert "'3/2' is no shard: give K/N" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ the merge

IDS = ["be-decode-eager-a", "be-decode-eager-b", "be-decode-eager-c", "be-decode-graph-a"]


def _records(ids, **fields):
    return [{**rec(case, backend=b, mode=m, exec_=e), **fields} for b, m, e, case in (i.split("-") for i in ids)]


def _shards(folder, parts, count=None, selection=IDS, status="complete", catalog=IDS, **fields):
    """Results files of shards 1..len(parts) (of `count`), shard k holding the runs `parts[k-1]`."""
    paths = []
    for k, part in enumerate(parts, 1):
        path = folder / f"shard-{k}.json"
        shard = Shard(k, count or len(parts)).of_selection(selection)
        write_results(path, _records(part, **fields),
                      run=dict(status=status, selected=part, catalog=catalog, shard=shard.section()))
        paths.append(path)
    return paths


PARTS = [IDS[:2], IDS[2:3], IDS[3:]]


def _merged(paths):
    return merge([read_results_file(p) for p in paths], "merged.json")


def test_shards_make_one_whole_run(tmp_path):
    run = _merged(_shards(tmp_path, PARTS))
    assert run.status == "complete" and run.shard is None and run.selected == sorted(IDS) and run.catalog == IDS
    assert sorted(r.test_id for r in run.records) == sorted(IDS)


def test_an_interrupted_shard_makes_an_interrupted_run(tmp_path):
    paths = _shards(tmp_path, PARTS)
    write_results(paths[1], [], run=dict(status="interrupted", selected=PARTS[1], catalog=IDS,
                                         shard=Shard(2, 3).of_selection(IDS).section()))
    run = _merged(paths)
    assert run.status == "interrupted" and run.missing(run.selected) == PARTS[1]


def _refusal(paths) -> str:
    with pytest.raises(ShardsError) as exc:
        _merged(paths)
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_a_missing_shard_is_refused(tmp_path):
    paths = _shards(tmp_path, PARTS)
    said = _refusal([paths[0], paths[2]])
    assert said.startswith("shard 2/3 of the run of ") and "is missing; run it (`--shard 2/3`)" in said


def test_a_shard_given_twice_is_refused(tmp_path):
    paths = _shards(tmp_path, PARTS)
    copy = tmp_path / "again.json"
    copy.write_text(paths[1].read_text())
    assert _refusal(paths + [copy]) == f"{paths[1]} and {copy} are both shard 2/3; give each shard of the run once"


def test_a_narrowed_shard_is_refused(tmp_path):
    """Shard 2 ran with -k leaving out one of its runs: the shards do not make their selection."""
    said = _refusal(_shards(tmp_path, [IDS[:2], [], IDS[3:]]))
    assert "the shards selected 3 runs, not the 4 of their selection" in said and "--backend" in said


def test_runs_in_two_shards_are_refused(tmp_path):
    said = _refusal(_shards(tmp_path, [IDS[:3], IDS[2:3], IDS[3:]]))
    assert f"both selected {IDS[2]}: not one split" in said


def test_a_file_of_an_unsharded_run_is_refused(tmp_path):
    paths = _shards(tmp_path, PARTS)
    whole = tmp_path / "whole.json"
    write_results(whole, _records(IDS), run=dict(status="complete", selected=IDS, catalog=IDS))
    assert _refusal(paths[:2] + [whole]).startswith(f"{whole}: not a shard")


@pytest.mark.parametrize("field, change, said", [
    ("the selection split", dict(count=4), "3 shards of selection"),
    ("the selection split", dict(selection=IDS[:3]), "3 shards of selection"),
    ("the catalog", dict(catalog=IDS[:3] + ["be-extend-eager-a"]), "4 catalog runs"),
    ("the device", dict(device="NVIDIA H100 80GB HBM3"), "CPU (x86_64) against NVIDIA H100 80GB HBM3"),
    ("the kit commit", dict(kit_commit="def"), "abc against def"),
    ("the kit commit", dict(kit_commit="abc+dirty"), "abc against abc+dirty"),
    ("the triton version", dict(versions=dict(torch="2.13.0", cuda="none", triton="3.8.0")), "3.9.0 against 3.8.0"),
], ids=["shard-count", "selection", "catalog", "device", "commit", "dirty", "versions"])
def test_shards_that_disagree_are_refused_naming_the_files_and_the_field(tmp_path, field, change, said):
    paths = _shards(tmp_path, PARTS)
    other = tmp_path / "other"
    other.mkdir()
    selection, count = change.pop("selection", IDS), change.pop("count", None)
    catalog = change.pop("catalog", IDS)
    odd = _shards(other, PARTS, count=count, selection=selection, **change)[2]
    if catalog != IDS:
        doc = json.loads(odd.read_text())
        doc["run"]["catalog"] = catalog
        odd.write_text(json.dumps(doc))
    message = _refusal(paths[:2] + [odd])
    assert message.startswith(f"{paths[0]} and {odd} disagree on {field}: "), message
    assert said in message


def test_shards_from_one_uncommitted_tree_are_taken_as_one():
    """Two `+dirty` shards of one commit: the edits are not recorded, so they cannot differ here."""
    run = merge([ResultsFile(f"s{k}.json", [Record.from_dict(r) for r in _records(part, kit_commit="abc+dirty")],
                             selected=part, catalog=IDS,
                             shard=Shard(k, 3).of_selection(IDS)) for k, part in enumerate(PARTS, 1)], "m.json")
    assert run.selected == sorted(IDS)


def test_a_library_only_some_shards_use_is_no_disagreement(tmp_path):
    paths = _shards(tmp_path, PARTS)
    doc = json.loads(paths[0].read_text())
    for r in doc["records"]:
        r["versions"]["flashinfer"] = "0.7.2"
    paths[0].write_text(json.dumps(doc))
    assert _merged(paths).status == "complete"


# ------------------------------------------------------------------------------------ the reruns

# A run of two backends: `be`, and `fix`, whose every run crashed at commit abc (a bug of the kit's
# own backend) and which a later commit re-ran whole.
BOTH = IDS + ["fix-decode-eager-a", "fix-decode-eager-b"]
FIX = BOTH[4:]
BOTH_PARTS = [IDS[:2] + FIX[:1], IDS[2:], FIX[1:]]


def _crashed_shards(folder):
    return _shards(folder, BOTH_PARTS, selection=BOTH, catalog=BOTH, outcome="fail", failure_class="crash")


def _rerun(folder, ids=FIX, name="rerun.json", status="complete", catalog=BOTH, shard=None, **fields):
    """The results file of an unsharded run of `ids` at commit fed, each passing."""
    run = dict(status=status, selected=ids, catalog=catalog)
    if shard:
        run["shard"] = shard.of_selection(ids).section()
    path = folder / name
    write_results(path, _records(ids, **{"kit_commit": "fed", **fields}), run=run)
    return path


def _merged_with(shards, reruns):
    return merge([read_results_file(p) for p in shards], "merged.json", [read_results_file(p) for p in reruns])


def test_a_rerun_replaces_its_backends_records_and_keeps_the_others(tmp_path):
    run = _merged_with(_crashed_shards(tmp_path), [_rerun(tmp_path)])
    assert {r.test_id: (r.outcome, r.kit_commit) for r in run.records} == {
        **{i: ("fail", "abc") for i in IDS}, **{i: ("pass", "fed") for i in FIX}}
    assert len(run.records) == len(BOTH) and run.reruns == [Rerun(("fix",), "fed")]
    assert run.status == "complete" and run.selected == sorted(BOTH) and run.catalog == BOTH and run.shard is None


def test_matrix_merge_writes_the_rerun_and_says_what_it_replaced(tmp_path, capsys):
    out = tmp_path / "merged.json"
    rerun = _rerun(tmp_path)
    assert matrix_cli.main(["merge", str(out), *map(str, _crashed_shards(tmp_path)), "--rerun", str(rerun)]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == f"matrix merge: replaced the shards' 2 records of fix with the 2 of {rerun} (kit commit fed)"
    merged = read_results_file(out)
    assert merged.reruns == [Rerun(("fix",), "fed")] and not merged.incomplete()
    assert {r.test_id: r.kit_commit for r in merged.records} == {**dict.fromkeys(IDS, "abc"), **dict.fromkeys(FIX, "fed")}
    # the committed form keeps which backends were re-run at which commit (its records name no commit)
    committed = json.loads(committed_text(merged))
    assert committed["run"]["reruns"] == [{"backends": ["fix"], "kit_commit": "fed"}]
    assert all("kit_commit" not in r for r in committed["records"])


def test_a_results_file_without_reruns_reads_as_before_and_a_bad_one_is_refused(tmp_path):
    path = _rerun(tmp_path)
    assert read_results_file(path).reruns == []
    doc = json.loads(path.read_text())
    doc["run"]["reruns"] = [{"backends": "fix", "kit_commit": "fed"}]
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match="its run's rerun .* is not the backends and kit_commit"):
        read_results_file(path)


def _rerun_refusal(shards, reruns) -> str:
    with pytest.raises(RerunError) as exc:
        _merged_with(shards, reruns)
    assert "\n" not in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize("change, said", [
    (dict(shard=Shard(1, 2)), "{rerun}: a rerun is shard 1/2 of its run; re-run its backends whole, without --shard"),
    (dict(status="interrupted"), "{rerun}: a rerun must be a complete run (interrupted run (interrupted): 2 of 2 "
                                 "selected runs recorded); run it again to the end"),
    (dict(device="NVIDIA H200"), "{shard} and {rerun} disagree on the device: CPU (x86_64) against NVIDIA H200; "
                                 "re-run the backend on the shards' device"),
    (dict(versions=dict(torch="2.13.0", cuda="none", triton="3.8.0")),
     "{shard} and {rerun} disagree on the triton version: 3.9.0 against 3.8.0; re-run the backend with the shards' "
     "libraries installed"),
    (dict(ids=FIX[:1]), "{rerun}: selected 1 runs of fix, not the 2 the shards selected (first differing: "
                        "fix-decode-eager-b); a rerun replaces whole backends"),
    (dict(catalog=BOTH + ["new-decode-eager-a"]), "{rerun}: its catalog run new-decode-eager-a is not in the "
                                                  "shards' catalog"),
    (dict(kit_commit=""), "{rerun}: a rerun's records must name one kit commit, not none"),
], ids=["shard", "incomplete", "device", "versions", "partial-backend", "not-in-catalog", "no-commit"])
def test_a_rerun_that_is_no_whole_run_of_its_backends_is_refused(tmp_path, change, said):
    shards = _crashed_shards(tmp_path)
    rerun = _rerun(tmp_path, **change)
    assert _rerun_refusal(shards, [rerun]).startswith(said.format(shard=shards[0], rerun=rerun))


def test_a_library_only_the_rerun_backends_report_is_theirs_to_change(tmp_path):
    """A wheel installed for the re-run (the flash_mla a DSA backend imports) changes what its backend's
    records report, not the run the other backends' records make; one the kept records report too must agree."""
    shards = _crashed_shards(tmp_path)
    for path in shards:
        doc = json.loads(path.read_text())
        for r in doc["records"]:
            r["versions"] = {**r["versions"], "flash_mla": "not installed"} if r["backend"] == "fix" else r["versions"]
        path.write_text(json.dumps(doc))
    installed = dict(rec("a")["versions"], flash_mla="1.0.0")
    run = _merged_with(shards, [_rerun(tmp_path, versions=installed)])
    assert {r.versions["flash_mla"] for r in run.records if r.backend == "fix"} == {"1.0.0"}
    shared = dict(installed, triton="3.8.0")
    assert "disagree on the triton version" in _rerun_refusal(shards, [_rerun(tmp_path, versions=shared)])


def test_a_backend_in_two_reruns_is_refused(tmp_path):
    shards = _crashed_shards(tmp_path)
    first, second = _rerun(tmp_path), _rerun(tmp_path, ids=IDS + FIX, name="again.json")
    assert _rerun_refusal(shards, [first, second]) == (f"{first} and {second} both re-ran fix; give one rerun per "
                                                       f"backend, its whole selection in one run")
    assert len(_merged_with(shards, [_rerun(tmp_path, ids=IDS, name="be.json"), first]).reruns) == 2


# --------------------------------------------------------------------- matrix merge, check and write


def _project_shards(folder, parts=((("a", "pass"), ("c", "fail")), (("b", "pass"),))):
    """Shards of a fresh run of the project fixture's committed runs (a, b, c: c a known failure)."""
    ids = [f"be-decode-eager-{case}" for part in parts for case, _ in part]
    paths = []
    for k, part in enumerate(parts, 1):
        records = [rec(case, outcome, "kernel" if outcome == "fail" else None) for case, outcome in part]
        path = folder / f"fresh-{k}.json"
        write_results(path, records, run=dict(status="complete", selected=[run_id(r["backend"], r["mode"], r["exec"], r["case"]) for r in records],
                                              catalog=ids, shard=Shard(k, len(parts)).of_selection(ids).section()))
        paths.append(str(path))
    return paths


def test_the_gate_takes_a_runs_shards_as_that_run(project, tmp_path):
    paths = _project_shards(tmp_path)
    assert gate.check(**project, fresh_paths=paths) == []
    disagreeing = _project_shards(tmp_path, ((("a", "pass"), ("c", "fail")), (("b", "fail"),)))
    problems = gate.check(**project, fresh_paths=disagreeing)
    assert any(p.startswith(f"uncovered failure: be-decode-eager-b [kernel] in {disagreeing[1]}") for p in problems)
    assert any("be-decode-eager-b: committed results/cpu.json say pass, this run says fail [kernel]" in p
               for p in problems), problems


def test_the_gate_refuses_a_run_missing_a_shard(project, tmp_path):
    """Alone, shard 1 is a narrowed run that agrees with the committed results: as a shard, its run
    is not there."""
    problems = gate.check(**project, fresh_paths=_project_shards(tmp_path)[:1])
    assert len(problems) == 1 and "shard 2/2 of the run of " in problems[0] and "is missing" in problems[0], problems


def test_matrix_merge_writes_the_run_or_refuses_in_one_line(project, tmp_path):
    paths = _project_shards(tmp_path)
    out = tmp_path / "merged.json"
    proc = subprocess.run([sys.executable, "-m", "matrix", "merge", str(out), *paths], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "2 shards, 3 of 3 selected runs recorded, complete" in proc.stdout, proc.stderr
    merged = read_results_file(out)
    assert merged.status == "complete" and merged.shard is None and len(merged.records) == 3
    assert run_matrix("check", project, "--fresh", str(out)).returncode == 0
    proc = subprocess.run([sys.executable, "-m", "matrix", "merge", str(out), paths[1]], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "shard 1/2 of the run of" in proc.stderr


def test_write_refuses_a_shard_as_committed_results(project, tmp_path):
    (project["results_dir"] / "cpu.json").write_text(open(_project_shards(tmp_path)[0]).read())
    proc = run_matrix("write", project)
    assert proc.returncode == 1, proc.stdout
    line = [line for line in proc.stderr.splitlines() if "cpu.json" in line]
    assert len(line) == 1 and "partial results: shard 1/2 of a run" in line[0] and "python -m matrix merge" in line[0]


# ------------------------------------------------------------------- the workflow's sharded CPU run

WORKFLOW = REPO / ".github" / "workflows" / "conformance.yml"
TOY = ["--cases", "tests.toys.tiny:CATALOG", "--case-set", "smoke", "--backend", "torch_native",
       "--backend", "tests.toys.dense:DenseGraphBackend"]


def _job_commands(job: str):
    """The one-line `run:` commands of a job of the workflow."""
    parts = re.split(r"^  ([\w-]+):\n", WORKFLOW.read_text(), flags=re.M)
    return re.findall(r"^ +- run: (.+)$", dict(zip(parts[1::2], parts[2::2]))[job], flags=re.M)


def _with_this_python(command: str) -> str:
    """A workflow command run by this interpreter: each job's `python` (or `.venv/bin/python`) is the
    one its set-up step installed into, here the one running the tests; whatever `python` PATH finds
    may lack the report layer's packages (tabulate)."""
    return re.sub(r"(^|&& )(?:\.venv/bin/)?python ", lambda m: f"{m.group(1)}{shlex.quote(sys.executable)} ", command)


def _no_bare_python(folder) -> dict:
    """The environment with a `python` first on PATH that fails naming itself: a command that reaches
    past this interpreter fails here rather than passing or failing by what that one has installed."""
    folder.mkdir()
    (folder / "python").write_text('#!/bin/sh\necho "a python from PATH ran, not the tests\' interpreter: $*" >&2\n'
                                   "exit 97\n")
    (folder / "python").chmod(0o755)
    return {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_the_workflows_shards_and_gate_make_and_judge_one_run(project, tmp_path):
    """The CPU shard jobs' command (shards 1/2 and 2/2, at once, on the tiny toy catalog, in one
    process each), then the gate job's merge and check as the workflow runs them: each file says
    its shard, their merge is what one unsharded session selects, and the gate passes on it and
    refuses it with a shard missing."""
    shard_job = _with_this_python(next(c for c in _job_commands("cpu-shard") if "--shard" in c))
    merge_cmd, check_cmd = _with_this_python(next(c for c in _job_commands("cpu-gate") if "matrix merge" in c)
                                             ).split(" && ")
    env = _no_bare_python(tmp_path / "bin")
    procs = []
    for k in (1, 2):
        cmd = (shard_job.replace("${{ matrix.shard }}", str(k)).replace("${{ strategy.job-total }}", "2")
               .replace("-n auto", "-n 0")
               .replace("tests/test_conformance.py", str(REPO / "tests" / "test_conformance.py")))
        procs.append(subprocess.Popen(shlex.split(cmd) + TOY + ["-q", "-p", "no:cacheprovider"], cwd=tmp_path,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stdout.read()
    shards = [read_results_file(tmp_path / f"cpu-shard-{k}.json") for k in (1, 2)]
    assert [str(f.shard) for f in shards] == ["1/2", "2/2"] and all(f.selected for f in shards)
    # the gate's project: committed results of another device only, no known failure (the toy runs all pass)
    write_fresh(project["results_dir"] / "cpu.json", [rec(c, device="GPU X") for c in ("a", "b")])
    project["known_path"].write_text(kf_text())
    assert run_matrix("write", project).returncode == 0
    gate_args = [a for key, option in (("readme_path", "--readme"), ("known_path", "--known-failures"),
                                       ("results_dir", "--results-dir")) for a in (option, str(project[key]))]

    def gate():
        merged = subprocess.run(merge_cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
        if merged.returncode:
            return merged
        return subprocess.run(shlex.split(check_cmd) + gate_args, cwd=tmp_path, env=env, capture_output=True, text=True)

    passed = gate()
    assert passed.returncode == 0, passed.stdout + passed.stderr
    run = read_results_file(tmp_path / "results-cpu.json")
    catalog = load_catalog("tests.toys.tiny:CATALOG")
    assert run.status == "complete" and not run.missing(run.selected)
    assert set(run.selected) == {f"{label}-decode-{e.value}-{case.name}" for label in ("torch_native", "toy_dense")
                                 for case in catalog.cases("smoke", MODES[0]) for e in EXECS}
    (tmp_path / "cpu-shard-2.json").unlink()
    refused = gate()
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "shard 2/2 of the run" in refused.stderr
