"""Results records -> the README pass tables: one per device, rows = backends,
columns = mode x exec. Deterministic (no timings)."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List, Sequence

from tabulate import tabulate

from kit.report.known_failures import KnownFailure, covering
from kit.modes import EXECS, MODES
from kit.report.record import ERROR, FAIL, PASS, UNSUPPORTED, WEAKER_THAN_A_GRAPH

FIRST_VERSIONS = ("torch", "cuda")  # then the backends' libraries, by name


def cell(records: List[Dict], entries: Sequence[KnownFailure]) -> str:
    if not records:
        return "not run"
    ran = [r for r in records if r["outcome"] not in (UNSUPPORTED, ERROR)]
    skipped = [r for r in records if r["outcome"] == UNSUPPORTED]
    stopped = [r for r in records if r["outcome"] == ERROR]  # no verdict: not counted against the backend
    if not ran and stopped:
        return f"{len(stopped)} not judged ({_values(r['failure_class'] for r in stopped)})"
    if not ran:
        return "— " + "; ".join(sorted({r["message"] for r in skipped}))
    passed = sum(r["outcome"] == PASS for r in ran)
    known, quarantined, unknown = defaultdict(int), defaultdict(int), Counter()
    for r in ran:
        if r["outcome"] != FAIL:
            continue
        entry = covering(entries, r)
        if entry is None:
            unknown[r["failure_class"]] += 1
        elif r.get("isolated"):
            quarantined[entry.id] += 1
        else:
            known[entry.id] += 1
    parts = [f"✗ {sum(unknown.values())}/{len(ran)} {'/'.join(sorted(unknown))}" if unknown
             else f"✓ {passed}/{len(ran)}"]
    if known:
        parts.append(f"xfail {sum(known.values())} ({', '.join(sorted(known))})")
    if quarantined:
        parts.append(f"quarantine {sum(quarantined.values())} ({', '.join(sorted(quarantined))}, subprocess)")
    if skipped:
        parts.append(f"{len(skipped)} unsupported")
    if stopped:
        parts.append(f"{len(stopped)} not judged ({_values(r['failure_class'] for r in stopped)})")
    # Graphs without CUDA, or an EXTEND path run eagerly, are not what a real graph proves: say so.
    labels = sorted({r.get("exec_detail") for r in ran} & set(WEAKER_THAN_A_GRAPH))
    return ", ".join(parts) + (f" ({', '.join(labels)})" if labels else "")


def _values(values) -> str:
    return ", ".join(sorted({str(v) for v in values}))


def environment_line(records: List[Dict]) -> str:
    """Library versions (each as the runs that use it report it), kit commit and date."""
    libraries = sorted({name for r in records for name in r["versions"]} - set(FIRST_VERSIONS))
    parts = [f"{name} {_values(r['versions'][name] for r in records if name in r['versions'])}"
             for name in FIRST_VERSIONS + tuple(libraries)]
    parts += [f"{f.replace('_', ' ')} {_values(r[f] for r in records)}" for f in ("kit_commit", "date")]
    return " · ".join(parts)


def device_table(device: str, records: List[Dict], entries: Sequence[KnownFailure], sources: str) -> str:
    groups = defaultdict(list)
    for r in records:
        groups[(r["backend"], r["mode"], r["exec"])].append(r)
    headers = ["backend"] + [f"{m.value} {e.value}" for m in MODES for e in EXECS]
    rows = [[backend] + [cell(groups[(backend, m.value, e.value)], entries) for m in MODES for e in EXECS]
            for backend in sorted({r["backend"] for r in records})]
    return f"### {device}\n\n{environment_line(records)} · from {sources}\n\n{tabulate(rows, headers, tablefmt='github')}\n"


def render(results: Dict[str, List[Dict]], entries: Sequence[KnownFailure]) -> str:
    """results: source name -> records. One table per device, devices sorted by name."""
    by_device, sources = defaultdict(list), defaultdict(set)
    for source, records in results.items():
        for r in records:
            by_device[r["device"]].append(r)
            sources[r["device"]].add(source)
    return "\n".join(device_table(d, by_device[d], entries, ", ".join(f"`{s}`" for s in sorted(sources[d])))
                     for d in sorted(by_device))
