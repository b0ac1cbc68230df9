"""Results records -> the README pass tables: one per device, rows = backends,
columns = mode x exec. Deterministic (no timings)."""
from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Dict, List, Sequence

from tabulate import tabulate

from kit.report.known_failures import QUARANTINE, KnownFailure, covering
from kit.modes import EXECS, MODES
from kit.report.record import ERROR, FAIL, PASS, UNSUPPORTED, WEAKER_THAN_A_GRAPH, Record

FIRST_VERSIONS = ("torch", "cuda")  # then the backends' libraries, by name
DECLARED_MARK = "≈"
DECLARED_LEGEND = (f"{DECLARED_MARK}: passed against the float64 reference taken in the backend's declared numerics "
                   f"(the rounding steps it takes on purpose: q or probabilities quantized to fp8, new tokens attended "
                   f"as handed, TF32 dots; docs/contract.md), not the exact one; ✓: passed against the exact one.")


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


@dataclasses.dataclass
class Tally:
    """A cell's runs, sorted by what they did."""
    ran: List[Record]
    skipped: List[Record]
    stopped: List[Record]  # no verdict (kit.report.record.ERROR): not counted against the backend
    passed: int = 0
    declared: int = 0  # of the passes, those judged under the backend's declared numerics (not exact)
    unknown: Counter = dataclasses.field(default_factory=Counter)  # class -> failures no entry covers
    known: Counter = dataclasses.field(default_factory=Counter)  # KF id -> expected failures
    quarantined: Counter = dataclasses.field(default_factory=Counter)  # KF id -> isolated ones

    @property
    def kind(self) -> str:
        """The cell's worst news: fail, quarantine, xfail, pass; or, nothing judged: not-judged, unsupported, not-run."""
        if not self.ran:
            return "not-judged" if self.stopped else "unsupported" if self.skipped else "not-run"
        return next(k for k, n in (("fail", self.unknown), ("quarantine", self.quarantined),
                                   ("xfail", self.known), ("pass", True)) if n)


def tally(records: List[Record], entries: Sequence[KnownFailure]) -> Tally:
    t = Tally([r for r in records if r.outcome not in (UNSUPPORTED, ERROR)],
              [r for r in records if r.outcome == UNSUPPORTED], [r for r in records if r.outcome == ERROR])
    t.passed = sum(r.outcome == PASS for r in t.ran)
    t.declared = sum(r.outcome == PASS and not r.exact for r in t.ran)
    for r in t.ran:
        if r.outcome != FAIL:
            continue
        entry = covering(entries, r)
        if entry is None:
            t.unknown[r.failure_class] += 1
        elif r.isolated and entry.mark == QUARANTINE:  # not a backend's own-process run (isolate.in_own_process)
            t.quarantined[entry.id] += 1
        else:
            t.known[entry.id] += 1
    return t


def cell(records: List[Record], entries: Sequence[KnownFailure], notes: Notes, never_run: int = 0) -> str:
    """What a cell's runs did, each count out of the runs that ran: `✗ 1/8 graph` (failures no
    entry covers, by class), `✓ 5/8` (passed against the exact reference), `≈ 3/8` (passed under the
    backend's declared numerics: DECLARED_LEGEND), `xfail 2/8 (KF-1)`, `quarantine 1/8 (KF-5,
    subprocess)`, `3 unsupported (1)`; `— unsupported (1)` when nothing ran. A part with no run is
    left out (no check mark over nothing passing). `never_run`: the cell's runs an interrupted
    session selected and never ran, said last (`✓ 16/16` over 8 runs missing read as whole)."""
    if never_run:
        shown = cell(records, entries, notes) if records else ""
        return f"{shown}{', ' if shown else ''}{never_run} never run"
    if not records:
        return "not run"
    t = tally(records, entries)
    if not t.ran and t.stopped:
        return f"{len(t.stopped)} not judged ({_values(r.failure_class for r in t.stopped)})"
    if not t.ran:
        return f"— unsupported ({notes.refs(r.message for r in t.skipped)})"
    of = f"/{len(t.ran)}"
    parts = []
    if t.unknown:
        parts.append(f"✗ {sum(t.unknown.values())}{of} {'/'.join(sorted(t.unknown))}")
    if t.passed > t.declared:
        parts.append(f"✓ {t.passed - t.declared}{of}")
    if t.declared:
        parts.append(f"{DECLARED_MARK} {t.declared}{of}")
    if t.known:
        parts.append(f"xfail {sum(t.known.values())}{of} ({', '.join(sorted(t.known, key=_kf_number))})")
    if t.quarantined:
        parts.append(f"quarantine {sum(t.quarantined.values())}{of} "
                     f"({', '.join(sorted(t.quarantined, key=_kf_number))}, subprocess)")
    if t.skipped:
        parts.append(f"{len(t.skipped)} unsupported ({notes.refs(r.message for r in t.skipped)})")
    if t.stopped:
        parts.append(f"{len(t.stopped)} not judged ({_values(r.failure_class for r in t.stopped)})")
    # Graphs without CUDA, or an EXTEND path run eagerly, are not what a real graph proves: say so.
    labels = sorted({r.exec_detail for r in t.ran} & set(WEAKER_THAN_A_GRAPH))
    return ", ".join(parts) + (f" ({', '.join(labels)})" if labels else "")


def _kf_number(entry_id: str) -> int:
    return int(entry_id.split("-")[1])


def _values(values) -> str:
    return ", ".join(sorted({str(v) for v in values}))


def environment_line(records: List[Record]) -> str:
    """Library versions, each as the runs that use it report it (when and by which commit the
    results were made is the results file's history, not a table's content)."""
    libraries = sorted({name for r in records for name in r.versions} - set(FIRST_VERSIONS))
    return " · ".join(f"{name} {_values(r.versions[name] for r in records if name in r.versions)}"
                      for name in FIRST_VERSIONS + tuple(libraries))


COLUMNS = tuple((m.value, e.value) for m in MODES for e in EXECS)


def cells(records: List[Record]) -> Dict[tuple, List[Record]]:
    """(backend, mode, exec) -> the records of that cell."""
    groups = defaultdict(list)
    for r in records:
        groups[(r.backend, r.mode, r.exec)].append(r)
    return groups


def by_device(results: Dict[str, List[Record]]):
    """[(device, its records, its sources)], devices sorted by name."""
    records, sources = defaultdict(list), defaultdict(set)
    for source, recs in results.items():
        for r in recs:
            records[r.device].append(r)
            sources[r.device].add(source)
    return [(d, records[d], sorted(sources[d])) for d in sorted(records)]


def device_table(device: str, records: List[Record], entries: Sequence[KnownFailure], sources: str) -> str:
    groups = cells(records)
    headers = ["backend"] + [f"{m} {e}" for m, e in COLUMNS]
    notes = Notes()
    rows = [[backend] + [cell(groups[(backend, m, e)], entries, notes) for m, e in COLUMNS]
            for backend in sorted({r.backend for r in records})]
    table = tabulate(rows, headers, tablefmt="github")
    unsupported = f"\n\nUnsupported, because:\n\n{notes.block()}" if notes.numbers else ""
    legend = f"\n\n{DECLARED_LEGEND}" if any(r.outcome == PASS and not r.exact for r in records) else ""
    return f"### {device}\n\n{environment_line(records)} · from {sources}\n\n{table}{legend}{unsupported}\n"


def render(results: Dict[str, List[Record]], entries: Sequence[KnownFailure]) -> str:
    """results: source name -> records. One table per device, devices sorted by name."""
    return "\n".join(device_table(d, records, entries, ", ".join(f"`{s}`" for s in sources))
                     for d, records, sources in by_device(results))


def summary_cell(records: List[Record], entries: Sequence[KnownFailure]) -> str:
    """A mode's runs of a backend, eager and graph together: `passed · failed · known · unsupported`
    (failed: no known-failure entry covers it; known: expected or quarantined), `—` when none ran."""
    t = tally(records, entries)
    if not t.ran:
        return "—"
    return (f"{t.passed} · {sum(t.unknown.values())} · {sum(t.known.values()) + sum(t.quarantined.values())} · "
            f"{len(t.skipped)}")


def summary(results: Dict[str, List[Record]], entries: Sequence[KnownFailure]) -> str:
    """The pass table of each device, one screen: rows = backends, columns = modes."""
    out = []
    for device, records, _ in by_device(results):
        groups = defaultdict(list)
        for r in records:
            groups[(r.backend, r.mode)].append(r)
        rows = [[backend] + [summary_cell(groups[(backend, m.value)], entries) for m in MODES]
                for backend in sorted({r.backend for r in records})]
        out.append(f"**{device}** (passed · failed · known · unsupported)\n\n"
                   f"{tabulate(rows, ['backend'] + [m.value for m in MODES], tablefmt='github')}\n")
    return "\n".join(out)
