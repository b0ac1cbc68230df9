"""Mutation scores (results/mutation/*.json, written by `python -m kit.mutate`) -> tables."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence


def table(records: Sequence[Dict], header: Optional[str] = None) -> str:
    """The score table from kit.mutation.Score.to_record() dicts."""
    lines = [header, ""] if header else []
    lines += ["| # | mutant | expected | caught by | classes seen | first failing run |",
              "|---|---|---|---|---|---|"]
    for r in records:
        classes = ", ".join(f"{c} {n}" for c, n in sorted(r["classes"].items())) or "-"
        caught = (f"{r['failed']}/{r['runs']}" + (f" (+{r['not_run']} not run)" if r["not_run"] else "")
                  + (f" ({r['known']} left out: the engine's known failures)" if r.get("known") else ""))
        mark = "" if r["caught"] else f" (harmless here: {r['harmless']})" if r.get("harmless") else " **MISSED**"
        first = f"`{r['first_failure']}`" if r["first_failure"] else "-"
        lines.append(f"| {r['number']} | `{r['mutant']}`{mark} | {' or '.join(r['expect'])} | {caught} | {classes} "
                     f"| {first} |")
    return "\n".join(lines)


def header(env: Dict, case_set: str, source: str) -> str:
    libraries = " · ".join(f"{name} {v}" for name, v in env["versions"].items())
    return (f"#### {env['device']}\n\n{case_set} cases · {libraries} · kit commit {env['kit_commit']} · "
            f"{env['date']} · from `{source}`")


class ScoresError(ValueError):
    """An unreadable mutation scores file; one line: the path, the problem, the fix."""


def block(results_dir) -> str:
    """One score table per committed results/mutation/*.json, as that run produced it."""
    parts = []
    for path in sorted((Path(results_dir) / "mutation").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            parts.append(table(data["scores"], header(data["environment"], data["case_set"],
                                                      f"results/mutation/{path.name}")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ScoresError(f"{path}: not a mutation scores file ({type(exc).__name__}: {exc}); regenerate it "
                              f"with `python -m kit.mutate --json {path}`") from None
    return "\n\n".join(parts) or "No mutation scores yet."
