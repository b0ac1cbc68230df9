"""Two runs' verdicts side by side: each backend's failures in both, and the runs both hold whose
verdict changed. What a results refresh (another device, another commit) or a change of the kit's
core is read against: a change of verdict is a finding to explain, not noise to regenerate away."""
from __future__ import annotations

import collections
from typing import Dict, List, Tuple

from kit.report.record import FAIL, UNSUPPORTED, Record, ResultsFile


def _failed(records: List[Record]) -> Dict[str, Tuple[int, int]]:
    """Per backend: (failed, executed) — executed leaves out what the backend does not run."""
    out: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
    for r in records:
        if r.outcome != UNSUPPORTED:
            out[r.backend][1] += 1
            out[r.backend][0] += r.outcome == FAIL
    return {b: (f, n) for b, (f, n) in out.items()}


def _share(pair) -> str:
    if pair is None:
        return "-"
    failed, executed = pair
    return f"{failed}/{executed} ({100 * failed / executed:.0f}%)" if executed else "0/0"


def changed(old: ResultsFile, new: ResultsFile) -> List[Tuple[str, str, str]]:
    """(run id, old verdict, new verdict) of every run both files hold whose verdict differs."""
    before = {r.test_id: r.verdict for r in old.records}
    return sorted((r.test_id, before[r.test_id], r.verdict) for r in new.records
                  if r.test_id in before and before[r.test_id] != r.verdict)


def report(old: ResultsFile, new: ResultsFile, shown: int = 40) -> str:
    """The comparison as text: per backend failed/executed before and after, the changed verdicts
    counted by (before, after), and the first `shown` changed runs."""
    devices = lambda f: ", ".join(sorted({r.device for r in f.records})) or "no records"
    common = {r.test_id for r in old.records} & {r.test_id for r in new.records}
    diffs = changed(old, new)
    lines = [f"{old.path} ({devices(old)}, {len(old.records)} runs) -> {new.path} ({devices(new)}, "
             f"{len(new.records)} runs): {len(common)} runs in both, {len(diffs)} changed verdict",
             "", "failed/executed per backend (before -> after):"]
    before, after = _failed(old.records), _failed(new.records)
    for backend in sorted(set(before) | set(after)):
        lines.append(f"  {backend}: {_share(before.get(backend))} -> {_share(after.get(backend))}")
    if diffs:
        lines += ["", "changed verdicts, by (before -> after):"]
        for (was, now), n in collections.Counter((w, n) for _, w, n in diffs).most_common():
            lines.append(f"  {n:5d}  {was} -> {now}")
        lines += ["", f"the first {min(shown, len(diffs))} of them:"]
        lines += [f"  {tid}: {was} -> {now}" for tid, was, now in diffs[:shown]]
    return "\n".join(lines)
