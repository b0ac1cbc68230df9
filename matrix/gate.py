"""The gate: README tables current, every failure covered, no stale known failure,
and a fresh run agreeing with the committed results of its device."""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from kit.known_failures import KnownFailuresError, covering, load
from kit.record import FAIL, PASS, UNSUPPORTED, read_results, record_id as _id, verdict as _verdict
from matrix import mutation, readme
from matrix.table import render


def committed_results(results_dir, problems: List[str]) -> Dict[str, List[Dict]]:
    out = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            out[f"{Path(results_dir).name}/{path.name}"] = read_results(path)
        except (ValueError, KeyError, json.JSONDecodeError) as exc:
            problems.append(f"{path}: unreadable results file: {exc}")
    return out


def expected_block(results: Dict[str, List[Dict]], entries) -> str:
    return render(results, entries) if results else "No results yet."


def readme_blocks(results: Dict[str, List[Dict]], entries, results_dir) -> List[Tuple[str, str, str, str]]:
    """(what, begin marker, end marker, generated text) of each generated README block."""
    return [("matrix tables", readme.BEGIN, readme.END, expected_block(results, entries)),
            ("mutation tables", readme.MUTANTS_BEGIN, readme.MUTANTS_END, mutation.block(results_dir))]


def _stale_readme(readme_path, blocks) -> List[str]:
    problems = []
    text = Path(readme_path).read_text()
    for what, begin, end, block in blocks:
        try:
            _, current, _ = readme.split(text, str(readme_path), begin, end)
        except readme.MarkersMissing as exc:
            problems.append(str(exc))
            continue
        if current.strip() == block.strip():
            continue
        diff = [d for d in difflib.unified_diff(current.strip().splitlines(), block.strip().splitlines(),
                                                lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("+++", "---")]
        problems.append(f"{readme_path}: the {what} differ from the results; run `python -m matrix write` "
                        f"(first difference: {diff[0][:200] if diff else 'whitespace'})")
    return problems


def _coverage(records: List[Dict], sources: Dict[int, str], entries) -> List[str]:
    problems = []
    for r in records:
        if r["outcome"] == FAIL and covering(entries, r) is None:
            problems.append(f"uncovered failure: {_id(r)} [{r['failure_class']}] in {sources[id(r)]}: fix it or "
                            f"add a KNOWN_FAILURES.md entry; repro: {r.get('repro', '')}")
    for e in entries:
        matched = [r for r in records if r["outcome"] != UNSUPPORTED and e.matches_record(r)]
        passing = [_id(r) for r in matched if r["outcome"] == PASS]
        if not matched:
            problems.append(f"stale known failure: {e.id} ({e.where}) matches no run in the results: "
                            f"remove it or fix its patterns")
        elif passing:
            problems.append(f"stale known failure: {e.id} ({e.where}) now passes for {', '.join(passing[:3])}"
                            f"{' ...' if len(passing) > 3 else ''}: remove it or narrow its case pattern")
    return problems


def _agreement(fresh: List[Dict], committed: Dict[str, List[Dict]]) -> List[str]:
    """Per device, for the backends this run covered: the same runs with the same verdicts."""
    problems = []
    for device in sorted({r["device"] for r in fresh}):
        mine = {_id(r): _verdict(r) for r in fresh if r["device"] == device}
        backends = {r["backend"] for r in fresh if r["device"] == device}
        theirs = {_id(r): (_verdict(r), src) for src, recs in committed.items() for r in recs
                  if r["device"] == device and r["backend"] in backends}
        if not theirs:
            continue  # nothing committed for this device and these backends: nothing to agree with
        for tid in sorted(set(mine) | set(theirs)):
            got, (want, src) = mine.get(tid), theirs.get(tid, (None, None))
            if got != want:
                problems.append(f"{device}: {tid}: committed {src or 'results'} say {want or 'not run'}, "
                                f"this run says {got or 'not run'}; regenerate the committed results")
    return problems


def check(readme_path, known_path, results_dir, fresh_paths: Sequence[str] = ()) -> List[str]:
    problems: List[str] = []
    try:
        entries = load(known_path)
    except KnownFailuresError as exc:
        problems += str(exc).splitlines()
        entries = []
    committed = committed_results(results_dir, problems)
    problems += _stale_readme(readme_path, readme_blocks(committed, entries, results_dir))
    fresh: List[Dict] = []
    sources: Dict[int, str] = {}
    for path in fresh_paths:
        for r in read_results(path):
            fresh.append(r)
            sources[id(r)] = str(path)
    fresh_devices = {r["device"] for r in fresh}
    judged = list(fresh)
    for src, recs in committed.items():
        for r in recs:
            if r["device"] not in fresh_devices:
                judged.append(r)
                sources[id(r)] = src
    problems += _coverage(judged, sources, entries)
    problems += _agreement(fresh, committed)
    return problems
