"""`python -m kit.repro.check_files PATH... --json OUT`: run every standalone file each PATH names (a
directory's: repro/, repro/cuda/; or the file) as a maintainer would, each in a fresh process with the kit not
importable, and write one JSON row a file: the KNOWN_FAILURES.md entries that link it, the device, its exit
code, its verdict line (its last line of output: `FAIL` where it shows a wrong output), its seconds, and for
each entry whether the run shows that entry's bug (`shows`: the one rule the suite holds the CPU files to as
well). A file in a directory named `cuda` shows what its entry's GPU shows: where torch sees no CUDA device it
is not run, and its row says so (`skipped`), so that the same command runs on any machine."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("kit", "backends")  # what a standalone file must not import: the kit and its adapters
# The line a traceback ends with (`module.NameError: message`), which PyTorch's and compilers' notes follow.
RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b")
# An output a file fails: past its limit, or (a graph's) padded rows the engine left NaN or inf.
WRONG_OUTPUT = re.compile(r"> limit|padded output rows NaN/inf: FAIL")
# A crash's place as the kit's messages write it (`layers/attention/attention.py:517`).
PLACE = re.compile(r"(?P<path>[\w./-]+\.py):(?P<line>\d+)")


def blocked_env(where: Path) -> Dict[str, str]:
    """This process's environment with a PYTHONPATH under `where` whose `kit` and `backends` raise on
    import: it comes first, before site-packages and any PYTHONPATH of the machine's (where an engine
    installed into a folder of its own is found), so an installed kit is shadowed too."""
    for package in BLOCKED:
        (where / package).mkdir(parents=True, exist_ok=True)
        (where / package / "__init__.py").write_text(
            f"raise ImportError('the standalone file imported {package}')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(where), os.environ.get("PYTHONPATH"))))
    return env


def linking(path: Path) -> list:
    """The KNOWN_FAILURES.md entries whose links name `path` (links are paths from the repo root)."""
    from kit.report.known_failures import load_or_default

    try:
        link = path.resolve().relative_to(ROOT).as_posix()
    except ValueError:  # a file outside this checkout: no entry links it
        return []
    return [e for e in load_or_default() if link in e.links]


def entries_linking(path: Path) -> List[str]:
    """The ids of the entries that link `path`."""
    return [e.id for e in linking(path)]


def _says(output: str, text: str) -> bool:
    """Whether a run's output holds a crash entry's text; a place the kit writes `path:line` a traceback
    writes `File ".../path", line N`."""
    place = PLACE.fullmatch(text)
    return text in output or bool(place and f'{place["path"]}", line {place["line"]},' in output)


def shows(entry, exit_code: Optional[int], stdout: str, stderr: str) -> bool:
    """Whether a standalone file's run shows its entry's bug: a crash entry's text in what it printed (a
    quarantined entry naming none: killed by a signal); any other its verdict FAIL, from a wrong output,
    or, where the entry's band lies under the limit (`kernel 0-1x`), from the inputs check alone."""
    from kit.report.record import CRASH

    if entry.failure_class == CRASH:
        if entry.text:
            return exit_code != 0 and _says(stdout + stderr, entry.text)
        return exit_code is not None and exit_code < 0 and entry.mark == "quarantine"
    lines = stdout.splitlines()
    inputs_only = bool(entry.band) and entry.band[1] <= 1
    return exit_code == 1 and bool(lines) and lines[-1] == "FAIL" and (
        bool(WRONG_OUTPUT.search(stdout)) != inputs_only) and ("changed in place" in stdout or not inputs_only)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _error_line(stderr: str) -> str:
    """What a failed file raised, where its traceback says; else its last line of stderr."""
    raised = [line for line in stderr.splitlines() if RAISED.match(line)]
    return raised[-1] if raised else _last_line(stderr)


def check_file(path: Path, device: str, cuda: bool, timeout: float) -> Dict:
    """One file's row; the file runs from an empty directory, so nothing of this checkout is on its path."""
    entries = linking(path)
    row = dict(file=str(path), entries=[e.id for e in entries], device=device, exit_code=None, verdict="",
               error="", seconds=0.0, skipped="", shows={})
    if path.parent.name == "cuda" and not cuda:
        row["skipped"] = f"needs a CUDA device (torch sees none on {device})"
        return row
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        try:
            done = subprocess.run([sys.executable, str(path.resolve())], cwd=tmp,
                                  env=blocked_env(Path(tmp) / "blocked"), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            row.update(seconds=round(time.monotonic() - start, 1), error=f"timed out after {timeout:g} s")
            return row
        row.update(exit_code=done.returncode, verdict=_last_line(done.stdout), seconds=round(time.monotonic() - start, 1),
                   error=_error_line(done.stderr) if done.returncode else "",
                   shows={e.id: shows(e, done.returncode, done.stdout, done.stderr) for e in entries})
    return row


def _said(row: Dict) -> str:
    """A row as the command prints it."""
    if row["skipped"]:
        return f"skipped: {row['skipped']}"
    said = f"exit {row['exit_code']}, {row['verdict']!r}"
    if row["error"] and row["verdict"] not in ("PASS", "FAIL"):  # a crash, or a timeout: what stopped it
        said += f", {row['error']!r}"
    shown = "; ".join(f"{'shows' if ok else 'does not show'} {entry}" for entry, ok in row["shows"].items())
    return f"{said} ({row['seconds']} s)" + (f": {shown}" if shown else "")


def files_in(paths: List[Path]) -> List[Path]:
    """The standalone files `paths` name: a directory's *.py, in order, or the file itself."""
    return [f for path in paths for f in (sorted(path.glob("*.py")) if path.is_dir() else [path])]


def check_paths(paths: List[Path], timeout: float) -> Dict:
    import torch

    from kit.harness.environment import device_name

    device, cuda = device_name(), torch.cuda.is_available()
    rows = []
    for path in files_in(paths):
        row = check_file(path, device, cuda, timeout)
        print(f"{path}: {_said(row)}", flush=True)
        rows.append(row)
    return dict(paths=[str(p) for p in paths], device=device, files=rows)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.repro.check_files", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", type=Path, nargs="+", metavar="PATH",
                        help="standalone files, or their directories (repro, repro/cuda)")
    parser.add_argument("--json", required=True, type=Path, help="where to write the rows")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a file may run (default 900)")
    args = parser.parse_args(argv)
    for path in args.paths:
        if not (path.is_dir() or (path.is_file() and path.suffix == ".py")):
            parser.error(f"{path}: neither a directory nor a .py file")
    report = check_paths(args.paths, args.timeout)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.json}: {len(report['files'])} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
