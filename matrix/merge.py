"""The shards of one run (`--shard K/N` on N machines) as one results file: refused, in one line
naming the files and what they disagree on, unless they are every shard of one selection, once
each, run on one device from one kit commit with the same library versions."""
from __future__ import annotations

import collections
from typing import Callable, Dict, List, Sequence, Tuple

from kit.report.record import COMPLETE, Record, ResultsFile
from kit.shard import fingerprint

ONE_RUN = "give the N files of one run: the same --shard N, --backend, --mode, --exec, --case-set and --cases"


class ShardsError(ValueError):
    """Files that are not the shards of one run: one line, the files, the field, the fix."""


def _values(f: ResultsFile, field: str) -> Dict[str, tuple]:
    """The values of a record field in a file (none where no record has it: committed results keep
    no kit commit)."""
    values = tuple(sorted({str(getattr(r, field)) for r in f.records if getattr(r, field)}))
    return {f"the {field.replace('_', ' ')}": values} if values else {}


def _versions(f: ResultsFile) -> Dict[str, tuple]:
    """Per library, the versions its records report (a shard without a backend using it says nothing)."""
    found = collections.defaultdict(set)
    for r in f.records:
        for library, version in r.versions.items():
            found[f"the {library} version"].add(version)
    return {library: tuple(sorted(versions)) for library, versions in found.items()}


# What the shards of one run agree on: (values of a file by field, the fix where two differ). A
# field a file has no value for is not compared. The kit commit is compared as recorded: `abc` and
# `abc+dirty` differ (one ran edits the other did not); two `abc+dirty` are taken as one tree, since
# the edits themselves are not recorded.
AGREEMENT: Tuple[Tuple[Callable[[ResultsFile], Dict[str, tuple]], str], ...] = (
    (lambda f: {"the selection split": (f"{f.shard.count} shards of selection {f.shard.selection}",)}, ONE_RUN),
    (lambda f: {"the catalog": (f"{len(f.catalog or [])} catalog runs, fingerprint {fingerprint(f.catalog or [])}",)},
     "run every shard from one checkout, with the same backends registered"),
    (lambda f: _values(f, "device"), "a merge is one device's run: merge each device's shards apart"),
    (lambda f: _values(f, "kit_commit"), "run every shard from one commit"),
    (_versions, "run every shard with the same libraries installed"),
)


def _disagreement(files: Sequence[ResultsFile]) -> str:
    for values_of, fix in AGREEMENT:
        seen: Dict[str, Tuple[tuple, str]] = {}
        for f in files:
            for field, value in values_of(f).items():
                first, path = seen.setdefault(field, (value, f.path))
                if value != first:
                    return (f"{path} and {f.path} disagree on {field}: {', '.join(first)} against "
                            f"{', '.join(value)}; {fix}")
    return ""


def _not_one_of_each(files: Sequence[ResultsFile]) -> str:
    """Why the files are not shards 1..N, each once."""
    count = files[0].shard.count
    by_index = collections.defaultdict(list)
    for f in files:
        by_index[f.shard.index].append(f.path)
    twice = next(((index, paths) for index, paths in sorted(by_index.items()) if len(paths) > 1), None)
    if twice:
        index, paths = twice
        return f"{paths[0]} and {paths[1]} are both shard {index}/{count}; give each shard of the run once"
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in by_index]
    if missing:
        return (f"shard {', '.join(missing)} of the run of {', '.join(f.path for f in files)} is missing; run it "
                f"(`--shard {missing[0]}`) and give its results file with the others")
    return ""


def _overlap_or_gap(files: Sequence[ResultsFile]) -> str:
    """Why the shards' selections are not their selection, each run once."""
    owner: Dict[str, str] = {}
    for f in files:
        for rid in f.selected or []:
            if rid in owner:
                return f"{owner[rid]} and {f.path} both selected {rid}: not one split; {ONE_RUN}"
            owner[rid] = f.path
    shard = files[0].shard
    if fingerprint(owner) != shard.selection:
        return (f"{', '.join(f.path for f in files)}: the shards selected {len(owner)} runs, not the {shard.runs} of "
                f"their selection: a shard was narrowed (-k, -m or test ids); narrow a sharded run with --backend, "
                f"--mode, --exec or --case-set only")
    return ""


def merge(files: Sequence[ResultsFile], path: str) -> ResultsFile:
    """The run whose shards `files` are, as one results file at `path`: its records (the shards'
    own), every run selected, and complete when every shard is. ShardsError where they are not the
    shards of one run."""
    not_shards = [f.path for f in files if f.shard is None]
    if not_shards:
        raise ShardsError(f"{not_shards[0]}: not a shard (its run has no `shard`: run without --shard K/N); "
                          f"merge only the results files of one sharded run")
    problem = _disagreement(files) or _not_one_of_each(files) or _overlap_or_gap(files)
    if problem:
        raise ShardsError(problem)
    unfinished = [f.status for f in files if f.status != COMPLETE]
    records: List[Record] = [r for f in files for r in f.records]
    return ResultsFile(path, records, unfinished[0] if unfinished else COMPLETE,
                       sorted(rid for f in files for rid in f.selected or []), files[0].catalog)
