"""The committed form of a results file: what a run found, without what differs from one run
of the same code to the next, so that regenerating with no verdict changed changes no byte."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict

from kit.report.record import LATER, VOLATILE, Record, ResultsFile
from kit.report.results import results_text, write_text

# Errors and tolerances move in their last digits between runs (threads sum in another order):
# kept to the 3 significant digits the failure messages print.
ROUNDED = ("max_err", "tol")
DIGITS = 3


# Where an environment installs its packages differs between machines (a crash message names the
# file it stopped in): kept from `site-packages/` on.
INSTALL_PREFIX = re.compile(r"(?:/[^\s'\"():]+)?/(site-packages|dist-packages)/")


def _rounded(value):
    return float(f"{value:.{DIGITS}g}") if isinstance(value, float) else value


def committed_record(record: Record) -> Dict:
    """The record without its VOLATILE fields (when and by which commit a run was made, and how
    long it took: the commit that adds the file says the first two, the third is noise), nor LATER
    fields at their default (a file written before them stays as it was)."""
    out = {k: v for k, v in record.to_dict().items()
           if k not in VOLATILE and not (k in LATER and v == LATER[k])}
    if isinstance(out.get("message"), str):
        out["message"] = INSTALL_PREFIX.sub(r"\1/", out["message"])
    for field in ROUNDED:
        if field in out:
            out[field] = _rounded(out[field])
    if "margins" in out:
        out["margins"] = [_rounded(m) for m in out["margins"]]
    return out


def committed_text(f: ResultsFile) -> str:
    """The file's text in committed form; a merged run's reruns keep their kit commit (the commit that
    adds the file names the shards' only)."""
    return results_text([committed_record(r) for r in f.records], f.run_section() if f.has_run_list else None)


def write_if_changed(path, text: str) -> bool:
    """Write text to path unless it already holds exactly that; whether it wrote."""
    path = Path(path)
    if path.is_file() and path.read_text() == text:
        return False
    write_text(path, text)
    return True
