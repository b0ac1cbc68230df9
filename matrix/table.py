"""Results records -> the README pass tables: one per device, rows = backends,
columns = mode x exec. Deterministic (no timings)."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List, Sequence

from tabulate import tabulate

from kit.known_failures import KnownFailure, match
from kit.modes import EXECS, MODES
from kit.runner import FAIL, PASS, UNSUPPORTED
ENV_FIELDS = ("torch", "cuda", "triton", "flashinfer", "kit_commit", "date")


def known_entry(record: Dict, entries: Sequence[KnownFailure]):
    """The entry covering this failing record (same class), if any."""
    entry = match(list(entries), record["backend"], record["mode"], record["exec"], record["case"])
    return entry if entry is not None and entry.failure_class == record["failure_class"] else None


def cell(records: List[Dict], entries: Sequence[KnownFailure]) -> str:
    if not records:
        return "not run"
    ran = [r for r in records if r["outcome"] != UNSUPPORTED]
    skipped = [r for r in records if r["outcome"] == UNSUPPORTED]
    if not ran:
        return "— " + "; ".join(sorted({r["message"] for r in skipped}))
    passed = sum(r["outcome"] == PASS for r in ran)
    known, quarantined, unknown = defaultdict(int), defaultdict(int), Counter()
    for r in ran:
        if r["outcome"] != FAIL:
            continue
        entry = known_entry(r, entries)
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
    # Graphs without CUDA, or an EXTEND path run eagerly, are not what a real graph proves: say so.
    labels = sorted({r.get("exec_detail") for r in ran} & {"emulated", "piecewise-eager"})
    return ", ".join(parts) + (f" ({', '.join(labels)})" if labels else "")


def _values(records: List[Dict], field: str) -> str:
    return ", ".join(sorted({str(r.get(field, "unknown")) for r in records}))


def device_table(device: str, records: List[Dict], entries: Sequence[KnownFailure], sources: str) -> str:
    groups = defaultdict(list)
    for r in records:
        groups[(r["backend"], r["mode"], r["exec"])].append(r)
    headers = ["backend"] + [f"{m.value} {e.value}" for m in MODES for e in EXECS]
    rows = [[backend] + [cell(groups[(backend, m.value, e.value)], entries) for m in MODES for e in EXECS]
            for backend in sorted({r["backend"] for r in records})]
    env = " · ".join(f"{f.replace('_', ' ')} {_values(records, f)}" for f in ENV_FIELDS)
    return f"### {device}\n\n{env} · from {sources}\n\n{tabulate(rows, headers, tablefmt='github')}\n"


def render(results: Dict[str, List[Dict]], entries: Sequence[KnownFailure]) -> str:
    """results: source name -> records. One table per device, devices sorted by name."""
    by_device, sources = defaultdict(list), defaultdict(set)
    for source, records in results.items():
        for r in records:
            by_device[r["device"]].append(r)
            sources[r["device"]].add(source)
    return "\n".join(device_table(d, by_device[d], entries, ", ".join(f"`{s}`" for s in sorted(sources[d])))
                     for d in sorted(by_device))
