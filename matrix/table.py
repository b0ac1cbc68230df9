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


class Notes:
    """The reasons cells cite, each written once under its table: a cell names its notes by number."""

    def __init__(self):
        self.numbers: Dict[str, int] = {}

    def refs(self, reasons) -> str:
        reasons = sorted(set(reasons))
        for reason in reasons:
            self.numbers.setdefault(reason, len(self.numbers) + 1)
        return ", ".join(str(self.numbers[r]) for r in sorted(reasons, key=self.numbers.get))

    def block(self) -> str:
        return "\n".join(f"- ({n}) {reason}" for reason, n in self.numbers.items())


def cell(records: List[Dict], entries: Sequence[KnownFailure], notes: Notes) -> str:
    """What a cell's runs did, each count out of the runs that ran: `✗ 1/8 graph` (failures no
    entry covers, by class), `✓ 5/8` (passed), `xfail 2/8 (KF-1)`, `quarantine 1/8 (KF-5,
    subprocess)`, `3 unsupported (1)`; `— unsupported (1)` when nothing ran. A part with no run is
    left out (no check mark over nothing passing)."""
    if not records:
        return "not run"
    ran = [r for r in records if r["outcome"] not in (UNSUPPORTED, ERROR)]
    skipped = [r for r in records if r["outcome"] == UNSUPPORTED]
    stopped = [r for r in records if r["outcome"] == ERROR]  # no verdict: not counted against the backend
    if not ran and stopped:
        return f"{len(stopped)} not judged ({_values(r['failure_class'] for r in stopped)})"
    if not ran:
        return f"— unsupported ({notes.refs(r['message'] for r in skipped)})"
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
    of = f"/{len(ran)}"
    parts = []
    if unknown:
        parts.append(f"✗ {sum(unknown.values())}{of} {'/'.join(sorted(unknown))}")
    if passed:
        parts.append(f"✓ {passed}{of}")
    if known:
        parts.append(f"xfail {sum(known.values())}{of} ({', '.join(sorted(known, key=_kf_number))})")
    if quarantined:
        parts.append(f"quarantine {sum(quarantined.values())}{of} "
                     f"({', '.join(sorted(quarantined, key=_kf_number))}, subprocess)")
    if skipped:
        parts.append(f"{len(skipped)} unsupported ({notes.refs(r['message'] for r in skipped)})")
    if stopped:
        parts.append(f"{len(stopped)} not judged ({_values(r['failure_class'] for r in stopped)})")
    # Graphs without CUDA, or an EXTEND path run eagerly, are not what a real graph proves: say so.
    labels = sorted({r.get("exec_detail") for r in ran} & set(WEAKER_THAN_A_GRAPH))
    return ", ".join(parts) + (f" ({', '.join(labels)})" if labels else "")


def _kf_number(entry_id: str) -> int:
    return int(entry_id.split("-")[1])


def _values(values) -> str:
    return ", ".join(sorted({str(v) for v in values}))


def environment_line(records: List[Dict]) -> str:
    """Library versions, each as the runs that use it report it (when and by which commit the
    results were made is the results file's history, not a table's content)."""
    libraries = sorted({name for r in records for name in r["versions"]} - set(FIRST_VERSIONS))
    return " · ".join(f"{name} {_values(r['versions'][name] for r in records if name in r['versions'])}"
                      for name in FIRST_VERSIONS + tuple(libraries))


def device_table(device: str, records: List[Dict], entries: Sequence[KnownFailure], sources: str) -> str:
    groups = defaultdict(list)
    for r in records:
        groups[(r["backend"], r["mode"], r["exec"])].append(r)
    headers = ["backend"] + [f"{m.value} {e.value}" for m in MODES for e in EXECS]
    notes = Notes()
    rows = [[backend] + [cell(groups[(backend, m.value, e.value)], entries, notes) for m in MODES for e in EXECS]
            for backend in sorted({r["backend"] for r in records})]
    table = tabulate(rows, headers, tablefmt="github")
    unsupported = f"\n\nUnsupported, because:\n\n{notes.block()}" if notes.numbers else ""
    return f"### {device}\n\n{environment_line(records)} · from {sources}\n\n{table}{unsupported}\n"


def render(results: Dict[str, List[Dict]], entries: Sequence[KnownFailure]) -> str:
    """results: source name -> records. One table per device, devices sorted by name."""
    by_device, sources = defaultdict(list), defaultdict(set)
    for source, records in results.items():
        for r in records:
            by_device[r["device"]].append(r)
            sources[r["device"]].add(source)
    return "\n".join(device_table(d, by_device[d], entries, ", ".join(f"`{s}`" for s in sorted(sources[d])))
                     for d in sorted(by_device))
