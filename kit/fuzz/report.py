"""What a fuzz run prints, from its ledger record (kit.fuzz.ledger): each new failure as the
user acts on it (the message, the case line to paste, the repro), the known ones by KF id,
and one summary line. Torch-free."""
from __future__ import annotations

from typing import Dict


def failure_text(f: Dict, backend: str, n: int, of: int, shrunk: bool) -> str:
    which = "minimal case" if shrunk else "smallest case seen failing (the shrink budget ran out: raise " \
                                          "--shrink-budget for a smaller one)"
    return "\n".join([
        f"NEW failure {n}/{of}: {backend} {f['mode']} {f['exec']} [{f['failure_class']}]",
        f"  {f['message']}",
        f"  {which}; paste into {_catalog_file(f)}:",
        f"{f['case_line']},",
        f"  repro: {f['repro']}",
    ])


def _catalog_file(f: Dict) -> str:
    """Where the case line goes: a recurrent case's with the other recurrent cases, a softmax one's by its mode."""
    return "cases/linear.py" if f["case_line"].startswith("RecurrentCase(") else f"cases/{f['mode']}.py"


def text(record: Dict) -> str:
    new, known = record["new"], record["known"]
    lines = [failure_text(f, record["backend"], i, len(new), record["shrunk"]) for i, f in enumerate(new, 1)]
    for kf, k in known.items():
        first = k["first"]
        lines.append(f"known: {kf} x{k['count']} ({record['backend']} {first['mode']} {first['exec']} "
                     f"[{first['failure_class']}], as KNOWN_FAILURES.md says; first: {first['case_line']})")
    if record["stopped"]:
        lines.append(f"stopped: {record['stopped']}")
    found = (f"first new failure at example {record['first_example']}, shrunk in {record['shrink_seconds']} s"
             if new else "no new failure")
    lines.append(f"fuzz {record['backend']} ({', '.join(record['modes'])}; {', '.join(record['execs'])}; "
                 f"{record['size']} cases; seed {record['seed']}): {record['examples']} examples in all "
                 f"({record['runs']} runs, {record['unsupported']} drawn cases unsupported), {record['search_seconds']} s "
                 f"of search: {found}; {len(new)} new, "
                 f"{sum(k['count'] for k in known.values())} known failures")
    return "\n".join(lines)
