"""The gate: README tables current, every failure covered, no stale known failure,
and a fresh run agreeing with the committed results of its device."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from kit.report.known_failures import KnownFailuresError, covering, load
from kit.report.record import (COMPLETE, ERROR, FAIL, PASS, UNSUPPORTED, Record, ResultsError, ResultsFile,
                               read_results_file)
from matrix import fuzz, mutation, readme
from matrix.committed import committed_text
from matrix.merge import ShardsError, merge
from matrix.table import render, summary

REGENERATE = "regenerate it with the full command for its device (docs/running.md, 'Regenerating the tables')"


def _first(ids: List[str]) -> str:
    return f"{ids[0]}{' ...' if len(ids) > 1 else ''}"


def _not_judged(f: ResultsFile) -> List[str]:
    """Run ids of the records its environment stopped before a verdict (kit.report.record.ERROR)."""
    return [r.test_id for r in f.records if r.outcome == ERROR]


def _partial(f: ResultsFile) -> str:
    """Why a committed results file is not a whole run of the catalog, or ''."""
    if f.shard is not None:
        return (f"{f.path}: partial results: shard {f.shard} of a run; commit the run whole, its shards merged "
                f"into one file: python -m matrix merge {f.path} SHARD...")
    stopped = _not_judged(f)
    if stopped:
        return (f"{f.path}: partial results: {len(stopped)} runs stopped by their environment before a verdict "
                f"(first: {_first(stopped)}); {REGENERATE}")
    if f.status != COMPLETE:
        return f"{f.path}: partial results: the run that wrote it is {f.status}; {REGENERATE}"
    lacking = f.missing(f.catalog)
    if lacking:
        return (f"{f.path}: partial results: lacks {len(lacking)} of the catalog's {len(f.catalog)} runs "
                f"for its device (first: {_first(lacking)}); {REGENERATE}")
    return ""


def results_dir_problem(results_dir) -> str:
    """Why `results_dir` holds no committed results to make tables from, or '': the tables made
    from nothing would replace every committed table."""
    if not Path(results_dir).is_dir():
        return f"--results-dir {results_dir}: no such directory; name the folder of the committed results files"
    if not any(Path(results_dir).glob("*.json")):
        return (f"--results-dir {results_dir}: no results file (*.json) in it; name the folder of the committed "
                f"results files (the kit's results/)")
    return ""


def committed_files(results_dir, problems: List[str]) -> Dict[str, ResultsFile]:
    """source -> each committed results file; a problem for each unreadable or partial one
    (so `matrix write` never makes tables from a narrowed or interrupted run)."""
    out = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            f = read_results_file(path)
        except ResultsError as exc:
            problems.append(str(exc))
            continue
        if _partial(f):
            problems.append(_partial(f))
        out[f"{Path(results_dir).name}/{path.name}"] = f
    return out


def committed_results(results_dir, problems: List[str]) -> Dict[str, List[Record]]:
    """source -> records of each committed results file (see committed_files)."""
    return {src: f.records for src, f in committed_files(results_dir, problems).items()}


def _not_in_committed_form(files: Dict[str, ResultsFile]) -> List[str]:
    return [f"{f.path}: not in its committed form (timings, dates or unrounded errors that differ from one run to "
            f"the next); run `python -m matrix write`" for f in files.values()
            if Path(f.path).read_text() != committed_text(f)]


def readme_blocks(results: Dict[str, List[Record]], entries, results_dir,
                  problems: List[str]) -> List[Tuple[str, str, str, str]]:
    """(what, begin marker, end marker, generated text) of each generated README block that can be
    made; a problem for each that cannot."""
    blocks = [("pass summary", readme.SUMMARY_BEGIN, readme.SUMMARY_END, summary(results, entries)),
              ("matrix tables", readme.BEGIN, readme.END, render(results, entries))]
    try:
        blocks.append(("mutation tables", readme.MUTANTS_BEGIN, readme.MUTANTS_END, mutation.block(results_dir)))
    except mutation.ScoresError as exc:
        problems.append(str(exc))
    try:
        blocks.append(("fuzz mutant tables", fuzz.BEGIN, fuzz.END, fuzz.block(results_dir)))
    except fuzz.FuzzTableError as exc:
        problems.append(str(exc))
    return blocks


def generated_files(readme_path, page_path) -> Dict[str, str]:
    """path -> text of the files the generated blocks are written in: the README, and the generated
    page where it is."""
    paths = [readme_path] + ([page_path] if page_path and Path(page_path).is_file() else [])
    return {str(p): Path(p).read_text() for p in paths}


def _stale_readme(texts: Dict[str, str], blocks) -> List[str]:
    problems = []
    for what, begin, end, block in blocks:
        readme_path = readme.holder(texts, begin, end)
        if readme_path is None:
            problems.append(str(readme.missing(texts, begin, end)))
            continue
        _, current, _ = readme.split(texts[readme_path], readme_path, begin, end)
        if current.strip() == block.strip():
            continue
        diff = [d for d in difflib.unified_diff(current.strip().splitlines(), block.strip().splitlines(),
                                                lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        problems.append(f"{readme_path}: the {what} differ from the results; run `python -m matrix write` "
                        f"(first difference: {diff[0][:200] if diff else 'whitespace'})")
    return problems


def not_judged(records: List[Record], entries) -> List[str]:
    """The ids of the entries no result can judge, `matrix check` names them: no run they match,
    whatever its outcome (a whole results file holds a record of every run of its catalog; results
    that predate a backend, a mode or a case, or a catalog narrowed to ci_cases, hold none)."""
    return [e.id for e in entries if not any(e.matches_record(r) for r in records)]


# A record whose worst layer's margin (error over limit) lies within this factor of 1, either way,
# has a verdict that a layout or a seed may turn: `matrix check` names such records.
NEAR_FACTOR = 2.0


def near_the_line(records: List[Record]) -> List[Record]:
    """The records whose worst layer's margin is within NEAR_FACTOR of the line (1), either way."""
    return [r for r in records if r.margins and 1 / NEAR_FACTOR <= max(r.margins) <= NEAR_FACTOR]


def _coverage(records: List[Record], sources: Dict[int, str], entries) -> List[str]:
    problems = []
    for r in records:
        if r.outcome == FAIL and covering(entries, r) is None:
            problems.append(f"uncovered failure: {r.test_id} [{r.failure_class}] in {sources[id(r)]}: fix it or "
                            f"add a KNOWN_FAILURES.md entry; repro: {r.repro}")
    for e in entries:
        if not any(e.matches_record(r) for r in records):
            continue  # no run it matches in these results' catalogs: they cannot judge it (not_judged)
        matched = [r for r in records if r.outcome != UNSUPPORTED and e.matches_record(r)]
        passing = [r.test_id for r in matched if r.outcome == PASS]
        if not matched:
            problems.append(f"stale known failure: {e.id} ({e.where}) matches no run in the results: "
                            f"remove it or fix its patterns")
        elif passing:
            problems.append(f"stale known failure: {e.id} ({e.where}) now passes for {', '.join(passing[:3])}"
                            f"{' ...' if len(passing) > 3 else ''}: remove it or narrow its case pattern")
        else:
            problems += [f"stale known failure: {e.id} ({e.where}): its case pattern {glob!r} matches no run in "
                         f"the results: remove it from the entry" for glob in _idle_patterns(e, records)]
    return problems


def _idle_patterns(entry, records: List[Record]) -> List[str]:
    """The globs of an entry of several that match no run the results hold, or only runs not run
    (unsupported): a glob left over, or mistyped, that would hide a later run it was not meant for."""
    if len(entry.case_patterns) < 2:
        return []
    ones = {glob: entry.narrowed(glob) for glob in entry.case_patterns}
    return [glob for glob, one in ones.items()
            if all(r.outcome == UNSUPPORTED for r in records if one.matches_record(r))]


def _fresh_problems(f: ResultsFile) -> List[str]:
    """A fresh run must say what it selected, have selected something, and have a record for each."""
    if not f.has_run_list:
        return [f"{f.path}: no run list (written by an older kit or by hand); run the suite again with this kit"]
    if not f.selected:
        return [f"{f.path}: no runs: the session selected none; check --backend/--mode/--exec/--case-set/-k"]
    stopped = _not_judged(f)
    if stopped:
        return [f"{f.path}: {len(stopped)} runs stopped by their environment before a verdict (first: "
                f"{_first(stopped)}: {next(r.message for r in f.records if r.test_id == stopped[0])[:300]}); "
                f"run them again (not compared with the committed results)"]
    if f.incomplete():
        return [f"{f.path}: {f.incomplete()}; run it again to the end (not compared with the committed results)"]
    return []


def _left_out(fresh: List[ResultsFile]) -> set:
    """Catalog runs the fresh sessions left out by their options (and none of them ran)."""
    ran = {r.test_id for f in fresh for r in f.records}
    return set().union(*(f.not_selected() for f in fresh)) - ran


def _agreement(fresh: List[ResultsFile], committed: Dict[str, List[Record]]) -> List[str]:
    """Per device, for the backends these runs covered: the same runs with the same verdicts
    (catalog runs the session left out by its options are not compared)."""
    problems = []
    records = [r for f in fresh for r in f.records]
    left_out = _left_out(fresh)
    for device in sorted({r.device for r in records}):
        mine = {r.test_id: r.verdict for r in records if r.device == device}
        backends = {r.backend for r in records if r.device == device}
        theirs = {r.test_id: (r.verdict, src) for src, recs in committed.items() for r in recs
                  if r.device == device and r.backend in backends and r.test_id not in left_out}
        if not theirs:
            continue  # nothing committed for this device and these backends: nothing to agree with
        for tid in sorted(set(mine) | set(theirs)):
            got, (want, src) = mine.get(tid), theirs.get(tid, (None, None))
            if got != want:
                problems.append(f"{device}: {tid}: committed {src or 'results'} say {want or 'not run'}, "
                                f"this run says {got or 'not run'}; regenerate the committed results")
    return problems


def _read_fresh(paths: Sequence[str], problems: List[str], sources: Dict[int, str]) -> List[ResultsFile]:
    """The fresh results files; a problem for each that cannot be read; each record's file in `sources`."""
    files = []
    for path in paths:
        try:
            files.append(read_results_file(path))
        except ResultsError as exc:
            problems.append(str(exc))
            continue
        sources.update((id(r), str(path)) for r in files[-1].records)
    return files


def _fresh_runs(files: List[ResultsFile], problems: List[str]) -> List[ResultsFile]:
    """The fresh results files, the shards among them as the one run they make (matrix.merge); a
    problem for shards that make no run."""
    shards = [f for f in files if f.shard is not None]
    runs = [f for f in files if f.shard is None]
    if shards:
        try:
            runs.append(merge(shards, " + ".join(f.path for f in shards)))
        except ShardsError as exc:
            problems.append(str(exc))
    return runs


def check(readme_path, known_path, results_dir, fresh_paths: Sequence[str] = (),
          unjudged: Optional[List[str]] = None, near: Optional[List[Record]] = None,
          page_path=None) -> List[str]:
    """The gate's problems; `unjudged` gets the entries no result can judge, `near` the judged
    records near the line (near_the_line); `page_path`: the generated page beside the README."""
    problems: List[str] = []
    sources: Dict[int, str] = {}
    read = _read_fresh(fresh_paths, problems, sources)
    if problems:  # a fresh file that cannot be read is the answer, at once: nothing else is judged by it
        return problems
    try:
        entries = load(known_path)
    except KnownFailuresError as exc:
        # Coverage and tables are read through the entries: without them every failure would be
        # reported uncovered and every table stale. The file's own problems are the whole answer.
        return str(exc).splitlines()
    files = committed_files(results_dir, problems)
    problems += _not_in_committed_form(files)
    committed = {src: f.records for src, f in files.items()}
    problems += _stale_readme(generated_files(readme_path, page_path),
                              readme_blocks(committed, entries, results_dir, problems))
    fresh: List[Record] = []
    whole: List[ResultsFile] = []
    for f in _fresh_runs(read, problems):
        trouble = _fresh_problems(f)
        problems += trouble
        if trouble:
            continue  # a partial run speaks for nothing: the committed results keep being judged
        whole.append(f)
        fresh += f.records
    fresh_devices = {r.device for r in fresh}
    left_out = _left_out(whole)
    judged = list(fresh)
    for src, recs in committed.items():
        for r in recs:
            if r.device not in fresh_devices or r.test_id in left_out:  # what no fresh run speaks for
                judged.append(r)
                sources[id(r)] = src
    problems += _coverage(judged, sources, entries)
    if unjudged is not None:
        unjudged += not_judged(judged, entries)
    if near is not None:
        near += near_the_line(judged)
    problems += _agreement(whole, committed)
    return problems
