"""Results -> one static HTML page: the matrix of each device, each cell coloured by what its
runs did; a cell with failing or expected-failing runs links to them (message, class, max err /
tol, the KNOWN_FAILURES.md entry, the repro command), and back; the failing cells listed at the
top, under what an interrupted run lacks. No script and no external asset: a cell's runs are a
section the page shows when the link targets it (CSS :target)."""
from __future__ import annotations

from collections import Counter
from html import escape
from typing import Dict, List, Sequence

from kit.report.known_failures import KnownFailure, covering, of_record
from kit.report.record import ERROR, FAIL, Record, ResultsFile, parse_run_id
from matrix.table import COLUMNS, Notes, by_device, cell, cells, environment_line, tally

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.5em; vertical-align: top; }
th { background: #eee; text-align: left; }
td a { color: inherit; display: block; }
.pass { background: #cdeccd; } .fail { background: #f4b4b4; } .xfail { background: #f7e2a8; }
.quarantine { background: #dcc8ef; } .unsupported { background: #e4e4e4; color: #555; } .not-run { background: #fff; }
.not-judged { background: #bfd7f0; } .partial { background: #fff; border: 2px dashed #a33; }
.runs { display: none; border: 2px solid #888; padding: 0.5em 1em; margin: 1em 0; }
.runs:target { display: block; }
.run { border-top: 1px solid #ccc; padding: 0.4em 0; }
dt { font-weight: bold; } dd { margin: 0 0 0.3em 1.5em; }
pre { white-space: pre-wrap; margin: 0; } code.repro { background: #f3f3f3; padding: 0.1em 0.3em; }
.warning { background: #f4b4b4; border: 2px solid #a33; padding: 0.5em 1em; font-weight: bold; }
"""
LEGEND = (("pass", "every run that ran passed"), ("fail", "a failure no known-failure entry covers"),
          ("xfail", "failing as KNOWN_FAILURES.md says"), ("quarantine", "a known failure run in a subprocess"),
          ("not-judged", "stopped by its environment before a verdict"),
          ("partial", "nothing failed, but runs of it never ran (an interrupted run)"), ("unsupported", "out of the backend's scope"),
          ("not-run", "not run"))


def _figure(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _entry(entries: Sequence[KnownFailure], r: Record) -> str:
    entry = covering(entries, r)
    if entry is None:
        near = of_record(entries, r)
        return ("none: no entry covers this failure" +
                (f" ({near.id} expects {escape(near.expects)})" if near else ""))
    links = " ".join(f'<a href="{escape(link)}">{escape(link)}</a>' for link in entry.links)
    return f"{escape(entry.id)} ({escape(entry.mark)}): {escape(entry.reason)}<br>{links}"


def _run(entries: Sequence[KnownFailure], r: Record) -> str:
    fields = [("verdict", escape(r.verdict)), ("message", f"<pre>{escape(r.message)}</pre>"),
              ("max err / tol", f"{_figure(r.max_err)} / {_figure(r.tol)}"),
              ("margins (per layer)", escape(", ".join(f"{m:.3g}x" for m in r.margins) or "-")),
              ("judged under", escape(r.numerics or "-")),
              ("known failure", _entry(entries, r)),
              ("repro", f'<code class="repro">{escape(r.repro)}</code>')]
    body = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in fields)
    return f'<div class="run"><b>{escape(r.test_id)}</b><dl>{body}</dl></div>'


def _never_run(files: Dict[str, ResultsFile]) -> Counter:
    """(device, backend, mode, exec) -> the runs an interrupted file's session selected and never ran."""
    out: Counter = Counter()
    for f in files.values():
        for device in {r.device for r in f.records}:
            out.update((device, *parse_run_id(rid)[:3]) for rid in f.missing(f.selected))
    return out


def _device(index: int, device: str, records: List[Record], sources: List[str], entries: Sequence[KnownFailure],
            failing_cells: List[str], never_run: Counter) -> str:
    groups, notes, sections = cells(records), Notes(), []
    head = "".join(f"<th>{escape(m)} {escape(e)}</th>" for m, e in COLUMNS)
    back = f'<p><a href="#table-{index}">back to the table</a> · <a href="#top">to the top</a></p>'
    rows = []
    for backend in sorted({r.backend for r in records}):
        tds = []
        for m, e in COLUMNS:
            runs, missing = groups[(backend, m, e)], never_run.get((device, backend, m, e), 0)
            text, kind = escape(cell(runs, entries, notes, missing)), tally(runs, entries).kind
            kind = "partial" if missing and kind in ("pass", "unsupported", "not-run") else kind
            shown = [r for r in runs if r.outcome in (FAIL, ERROR)]
            if shown:
                anchor = escape(f"runs-{index}-{backend}-{m}-{e}")
                where = f"{escape(backend)} · {escape(m)} {escape(e)}"
                text = f'<a href="#{anchor}">{text}</a>'
                sections.append(f'<section class="runs" id="{anchor}"><h3>{escape(device)}: {where}</h3>{back}'
                                + "".join(_run(entries, r) for r in shown) + "</section>")
                if kind in ("fail", "not-judged"):
                    failing_cells.append(f'<li><a href="#{anchor}">{escape(device)}: {where}</a>: {text}</li>')
            tds.append(f'<td class="{kind}">{text}</td>')
        rows.append(f"<tr><th>{escape(backend)}</th>{''.join(tds)}</tr>")
    reasons = "".join(f"<li>({n}) {escape(reason)}</li>" for reason, n in notes.numbers.items())
    return (f"<h2>{escape(device)}</h2><p>{escape(environment_line(records))} · from "
            f"{', '.join(escape(s) for s in sources)}</p><table id=\"table-{index}\"><tr><th>backend</th>{head}</tr>"
            f"{''.join(rows)}</table>" + (f"<p>Unsupported, because:</p><ul>{reasons}</ul>" if reasons else "")
            + "".join(sections))


def page(files: Dict[str, ResultsFile], entries: Sequence[KnownFailure]) -> str:
    """files: source name -> results file. At the top, what an interrupted or partial file lacks,
    then the failing cells, each a link to its runs; each device's table; each cell's runs, with
    a link back to the table."""
    legend = " ".join(f'<span class="{k}">&nbsp;{k.replace("-", " ")}&nbsp;</span> {escape(what)};'
                      for k, what in LEGEND)
    warnings = "".join(f'<p class="warning">{escape(source)}: {escape(f.incomplete())}: this page shows the runs '
                       f'it recorded only</p>' for source, f in files.items() if f.incomplete())
    failing: List[str] = []
    results = {source: f.records for source, f in files.items()}
    never_run = _never_run(files)
    body = "".join(_device(i, d, records, sources, entries, failing, never_run)
                   for i, (d, records, sources) in enumerate(by_device(results)))
    summary = (f"<h2>Failing cells ({len(failing)})</h2><ul>{''.join(failing)}</ul>" if failing
               else "<p>No failing cell: every failure is a known one.</p>" if body else "")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Attention conformance matrix'
            f'</title><style>{STYLE}</style></head><body id="top"><h1>Attention conformance matrix</h1>{warnings}'
            f'<p>{legend} a coloured cell with a link opens its failing runs.</p>{summary}'
            f'{body or "<p>No results.</p>"}</body></html>\n')
