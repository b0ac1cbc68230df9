"""KNOWN_FAILURES.md, machine-read: each entry turns the runs it matches into strict
expected failures (or, marked `quarantine`, runs them in a subprocess)."""
from __future__ import annotations

import dataclasses
import fnmatch
import re
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from kit.modes import EXECS, MODES
from kit.report.record import FAIL, FAILURE_CLASSES as CLASSES, PASS, Record

BEGIN, END = "<!-- known-failures:begin -->", "<!-- known-failures:end -->"
COLUMNS = ("id", "backend", "mode", "exec", "case", "device", "class", "mark", "reason", "link")
XFAIL, QUARANTINE = "xfail", "quarantine"
ROW_TEMPLATE = "| KF-<n> | <backend> | <mode or *> | <eager|graph|*> | <case globs, space-separated> | <device glob, e.g. *H100* or *> | " \
               "<kernel|graph|kv-write|crash, then optionally its band: `1.5-40x`, one per layer id `1200-16000x/0-1x`, " \
               "or `\"text of its message\"`> | " \
               "<xfail|quarantine> | <reason> | " \
               "<links, space-separated: the issue or PR tracking the bug, then source lines (URLs or repo paths)> |"
# The class cell: the failure class, then optionally what the failure must look like to be this one,
# so that a second bug in a region that already fails is still seen: the band of its worst layer's
# error over its limit (RunResult.margins), e.g. `kernel 1.5-40x`; or a band per layer id, `/`-separated, e.g.
# `kernel 1200-16000x/0-1x`, where a bug of one layer must leave the others as they are (a second bug in
# another layer is seen though its margin is within the first one's band); or text its message holds, e.g.
# `crash "illegal memory access"`.
BAND = r"\d+(?:\.\d+)?-\d+(?:\.\d+)?x"
CLASS_CELL = re.compile(rf'(?P<cls>[\w-]+)(?:\s+(?P<bands>{BAND}(?:/{BAND})*)|\s+"(?P<text>[^"]+)")?')
# What a record written before records carried margins (kit.report.record.LATER) shows of them: each output its
# message judges (its first failing batch's), "output ok: max err A <= tol B", or "output wrong: max err A > tol B",
# then maybe "; a head's error is C of its output's magnitude (RMS) > D" (kit.harness.checks.OutputCheck.describe).
SHOWN_OUTPUT = re.compile(r"output (?:ok|wrong): max err (?P<err>\S+) (?:>|<=) tol (?P<tol>[\d.e+-]+)"
                          r"(?:; a head's error is (?P<rel>\S+) of its output's magnitude \(RMS\) "
                          r"> (?P<rel_tol>[\d.e+-]+))?")
# An upstream issue or PR (a URL), or a file in the repo that shows the failure (a path, maybe with #anchor).
LINK = re.compile(r"https?://[\w.-]+\.\w+\S*|(?!/|\.\./)[\w.-]+(/[\w.-]+)*(\.\w+|/[\w.-]+)/?(#\S+)?")


class KnownFailuresError(ValueError):
    """Malformed file; the message has one `path:line: problem; fix: ...` per problem."""


@dataclasses.dataclass(frozen=True)
class KnownFailure:
    id: str
    backend: str
    mode: str
    exec: str
    case: str
    device: str
    failure_class: str
    mark: str
    reason: str
    link: str  # one or more links, space-separated
    where: str  # path:line, for messages
    band: Optional[Tuple[float, float]] = None  # its worst layer's margin, low and high (CLASS_CELL)
    layer_bands: Tuple[Tuple[float, float], ...] = ()  # or each layer id's margin, low and high (CLASS_CELL)
    text: str = ""  # what its message holds (CLASS_CELL)

    @property
    def pinned(self) -> bool:
        """Whether the entry says what its failure looks like (a band or a message), not only its class."""
        return self.band is not None or bool(self.layer_bands) or bool(self.text)

    @property
    def expects(self) -> str:
        """What the entry expects, as messages say it: `[kernel]`, `[kernel] at 1.5-40x its limit`."""
        if self.band is not None:
            return f"[{self.failure_class}] at {self.band[0]:g}-{self.band[1]:g}x its limit"
        if self.layer_bands:
            per_layer = ", ".join(f"layer {i} {lo:g}-{hi:g}x" for i, (lo, hi) in enumerate(self.layer_bands))
            return f"[{self.failure_class}] at {per_layer} its limit"
        return f"[{self.failure_class}]" + (f' saying "{self.text}"' if self.text else "")

    def fits(self, result) -> bool:
        """Whether a failing run of the entry's class (a RunResult or Record) is this failure: its worst
        layer's margin within the band, its message holding the text (where the entry pins them)."""
        worst = worst_margin(result)
        if self.band is not None and not (worst is not None and self.band[0] <= worst <= self.band[1]):
            return False
        if self.layer_bands and not (len(result.margins) == len(self.layer_bands) and all(
                lo <= m <= hi for m, (lo, hi) in zip(result.margins, self.layer_bands))):
            return False
        return self.text in result.message

    @property
    def links(self) -> List[str]:
        return self.link.split()

    @property
    def case_patterns(self) -> List[str]:
        """The case cell's globs: one cause's runs may need several to be named exactly."""
        return self.case.split()

    def narrowed(self, pattern: str) -> "KnownFailure":
        """The entry with one of its case globs only (the gate judges each glob of several)."""
        return dataclasses.replace(self, case=pattern)

    def matches(self, backend: str, mode: str, exec_: str, case: str, device: str, dtype: str) -> bool:
        """A case pattern is matched against the case's name and against `name@dtype` (`*@fp32`:
        every fp32 case, whatever its name says); the run matches where any of the entry's does."""
        return all(fnmatch.fnmatchcase(value, pattern) for value, pattern in (
            (backend, self.backend), (mode, self.mode), (exec_, self.exec), (device, self.device))) and any(
            fnmatch.fnmatchcase(case, glob) or fnmatch.fnmatchcase(f"{case}@{dtype}", glob)
            for glob in self.case_patterns)

    def matches_record(self, record: Record) -> bool:
        return self.matches(record.backend, record.mode, record.exec, record.case, record.device, record.dtype)


def worst_margin(result) -> Optional[float]:
    """A failing run's worst layer's error over its limit (a RunResult or Record): its margins' largest; for a
    record written before records carried margins, the largest its message shows (the outputs of its first
    failing batch, by either rule, as kit.harness.checks.OutputCheck.excess); None where neither says one."""
    if result.margins:
        return max(result.margins)
    shown = [max(float(m["err"]) / float(m["tol"]), float(m["rel"]) / float(m["rel_tol"]) if m["rel"] else 0.0)
             for m in SHOWN_OUTPUT.finditer(result.message)]
    return max(shown) if shown else None


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _bands(cell) -> List[Tuple[float, float]]:
    """The class cell's bands, low and high: none, the worst layer's, or one per layer id."""
    if not cell["bands"]:
        return []
    return [(float(lo), float(hi)) for lo, hi in (b[:-1].split("-") for b in cell["bands"].split("/"))]


def _problems(cells: List[str], seen_ids) -> List[str]:
    if len(cells) != len(COLUMNS):
        return [f"expected {len(COLUMNS)} cells ({', '.join(COLUMNS)}), got {len(cells)}"]
    row = dict(zip(COLUMNS, cells))
    out = []
    if not re.fullmatch(r"KF-\d+", row["id"]):
        out.append(f"id {row['id']!r} is not KF-<number>")
    elif row["id"] in seen_ids:
        out.append(f"id {row['id']} used twice")
    modes = {m.value for m in MODES}
    if row["mode"] != "*" and not any(fnmatch.fnmatchcase(m, row["mode"]) for m in modes):
        out.append(f"mode {row['mode']!r} matches none of {sorted(modes)}")
    if row["exec"] not in {e.value for e in EXECS} | {"*"}:
        out.append(f"exec {row['exec']!r} is not eager, graph or *")
    cell = CLASS_CELL.fullmatch(row["class"])
    if cell is None or cell["cls"] not in CLASSES:
        out.append(f"class {row['class']!r} is not one of {', '.join(CLASSES)}, optionally followed by a band "
                   f"(1.5-40x) or quoted message text")
    else:
        out += [f"band {lo:g}-{hi:g}x is empty" for lo, hi in _bands(cell) if not 0 <= lo <= hi]
    if row["mark"] not in (XFAIL, QUARANTINE):
        out.append(f"mark {row['mark']!r} is not xfail or quarantine")
    for field in ("backend", "case", "device", "reason", "link"):
        if not row[field]:
            out.append(f"empty {field}")
    out += [f"link {link!r} is neither a URL nor a repo path" for link in row["link"].split()
            if not LINK.fullmatch(link)]
    return out


def parse(text: str, path: str = "KNOWN_FAILURES.md") -> List[KnownFailure]:
    lines = text.splitlines()
    try:
        start, end = lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise KnownFailuresError(f"{path}:1: markers {BEGIN} and {END} not found; fix: put the table "
                                 f"between them") from None
    entries, errors, seen = [], [], set()
    for n in range(start + 1, end):
        line = lines[n]
        if not line.strip():
            continue
        cells = _cells(line)
        if cells == list(COLUMNS) or set("".join(cells)) <= set("-: "):
            continue  # header and separator rows
        problems = _problems(cells, seen)
        where = f"{path}:{n + 1}"
        if problems:
            errors.append(f"{where}: {'; '.join(problems)}; fix: write the row as {ROW_TEMPLATE}")
            continue
        row = dict(zip(COLUMNS, cells))
        seen.add(row["id"])
        cell = CLASS_CELL.fullmatch(row["class"])
        bands = _bands(cell)
        entries.append(KnownFailure(row["id"], row["backend"], row["mode"], row["exec"], row["case"], row["device"],
                                    cell["cls"], row["mark"], row["reason"], row["link"], where,
                                    bands[0] if len(bands) == 1 else None, tuple(bands) if len(bands) > 1 else (),
                                    cell["text"] or ""))
    if errors:
        raise KnownFailuresError("\n".join(errors))
    return entries


def load(path) -> List[KnownFailure]:
    path = Path(path)
    if not path.is_file():
        restore = f"restore it (git checkout -- {path.name}) or " if path.resolve() == DEFAULT_PATH else ""
        raise KnownFailuresError(f"{path}: no such file; fix: {restore}name an existing known-failures table "
                                 f"with --known-failures")
    return parse(path.read_text(), str(path))


DEFAULT_PATH = Path(__file__).resolve().parents[2] / "KNOWN_FAILURES.md"


def load_or_default(path=None) -> List[KnownFailure]:
    """`path`'s entries; without one, the kit's KNOWN_FAILURES.md where present (none elsewhere)."""
    if path is None:
        return load(DEFAULT_PATH) if DEFAULT_PATH.exists() else []
    return load(path)


def of_backend(entries: Sequence[KnownFailure], backend: str, device: str) -> List[KnownFailure]:
    """The entries that can match a run of `backend` on `device`, in order: what `match` needs to
    look at for that backend's runs (a session's collection matches thousands against each)."""
    return [e for e in entries if fnmatch.fnmatchcase(backend, e.backend) and fnmatch.fnmatchcase(device, e.device)]


def match(entries: Sequence[KnownFailure], backend: str, mode: str, exec_: str, case: str,
          device: str, dtype: str) -> Optional[KnownFailure]:
    """The entry for this run, if any: the first match, which says how the run fails; marked
    quarantine where any match is (the run must not take its process down, whatever the table's
    order: a run that fails one way before a later step would fault still goes to a subprocess)."""
    found = [e for e in entries if e.matches(backend, mode, exec_, case, device, dtype)]
    if not found:
        return None
    if any(e.mark == QUARANTINE for e in found):
        return dataclasses.replace(found[0], mark=QUARANTINE)
    return found[0]


def is_expected(entry: Optional[KnownFailure], result) -> bool:
    """The expected-failure rule: a run (a RunResult or Record) is its entry's known failure only if it
    fails with the entry's class, within the entry's band or with its text where it pins them (a pass,
    another class or another failure is a failure of the suite)."""
    return (entry is not None and result.outcome == FAIL and result.failure_class == entry.failure_class
            and entry.fits(result))


def against(entry: Optional[KnownFailure], result) -> str:
    """What a run is against its entry, in one line ('' without one): the entry's known failure
    (is_expected), another failure, a pass (the entry stale here) or no verdict. Every command
    that tells a user about a run's entry says it in these words."""
    if entry is None:
        return ""
    if is_expected(entry, result):
        return f"known failure: {entry.id} ({entry.where}): {entry.reason}"
    expects = f"{entry.id} ({entry.where}) expects {entry.expects} here"
    if result.outcome == FAIL:
        worst = worst_margin(result)
        margin = f" at {worst:.3g}x its limit" if worst is not None else ""
        return f"not the known failure: {expects}, this run failed [{result.failure_class}]{margin}"
    if result.outcome == PASS:
        return f"{expects}, but this run passed: the entry is stale here"
    return f"{expects}; this run: {result.outcome}"


def of_record(entries: Sequence[KnownFailure], record: Record) -> Optional[KnownFailure]:
    """The entry for a results record's run, if any (see match)."""
    return match(entries, record.backend, record.mode, record.exec, record.case, record.device, record.dtype)


def covering(entries: Sequence[KnownFailure], record: Record) -> Optional[KnownFailure]:
    """The entry a results record is the expected failure of, if any."""
    entry = of_record(entries, record)
    return entry if is_expected(entry, record) else None
