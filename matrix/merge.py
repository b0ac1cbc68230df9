"""The shards of one run (`--shard K/N` on N machines) as one results file: refused, in one line
naming the files and what they disagree on, unless they are every shard of one selection, once
each, run on one device from one kit commit with the same library versions. Reruns replace whole
backends' records with a later, complete run of them (the kit's own backend fixed, or runs their
environment stopped), each record keeping the commit that judged it."""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Dict, List, Sequence, Tuple

from kit.report.record import COMPLETE, Record, Rerun, ResultsFile, parse_run_id
from kit.shard import fingerprint

ONE_RUN = "give the N files of one run: the same --shard N, --backend, --mode, --exec, --case-set and --cases"


class ShardsError(ValueError):
    """Files that are not the shards of one run: one line, the files, the field, the fix."""


class RerunError(ShardsError):
    """A rerun that cannot replace its backends' records in the shards' run: one line, the files,
    what they disagree on, the fix."""


def _values(f: ResultsFile, field: str) -> Dict[str, tuple]:
    """The values of a record field in a file (none where no record has it: committed results keep
    no kit commit)."""
    values = tuple(sorted({str(getattr(r, field)) for r in f.records if getattr(r, field)}))
    return {f"the {field.replace('_', ' ')}": values} if values else {}


def _devices(f: ResultsFile) -> Dict[str, tuple]:
    return _values(f, "device")


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
    (_devices, "a merge is one device's run: merge each device's shards apart"),
    (lambda f: _values(f, "kit_commit"), "run every shard from one commit"),
    (_versions, "run every shard with the same libraries installed"),
)
# What a rerun agrees on with the shards' records it keeps: the run it completes is one device's, with
# one set of libraries (the kit commit is what differs); a library only the re-run backends report
# (one installed for their run) is theirs to change.
RERUN_AGREEMENT = (
    (_devices, "re-run the backend on the shards' device"),
    (_versions, "re-run the backend with the shards' libraries installed"),
)


def _disagreement(files: Sequence[ResultsFile], agreement=AGREEMENT) -> str:
    for values_of, fix in agreement:
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


def merge(files: Sequence[ResultsFile], path: str, reruns: Sequence[ResultsFile] = ()) -> ResultsFile:
    """The run whose shards `files` are, as one results file at `path`: its records (the shards'
    own, but those of the backends `reruns` ran again: theirs), every run selected, and complete
    when every shard is. ShardsError where they are not the shards of one run, RerunError where a
    rerun is not a whole run of its backends in that run."""
    not_shards = [f.path for f in files if f.shard is None]
    if not_shards:
        raise ShardsError(f"{not_shards[0]}: not a shard (its run has no `shard`: run without --shard K/N); "
                          f"merge only the results files of one sharded run")
    problem = _disagreement(files) or _not_one_of_each(files) or _overlap_or_gap(files)
    if problem:
        raise ShardsError(problem)
    unfinished = [f.status for f in files if f.status != COMPLETE]
    records: List[Record] = [r for f in files for r in f.records]
    run = ResultsFile(path, records, unfinished[0] if unfinished else COMPLETE,
                      sorted(rid for f in files for rid in f.selected or []), files[0].catalog)
    for rerun in reruns:
        _replace(run, rerun, files)
    _not_one_rerun_each(reruns)
    return run


def _backends(run_ids) -> set:
    return {parse_run_id(rid)[0] for rid in run_ids}


def _not_whole(run: ResultsFile, rerun: ResultsFile) -> str:
    """Why `rerun` is not a complete, unsharded run of whole backends of `run`'s selection, or ''."""
    if rerun.shard is not None:
        return (f"{rerun.path}: a rerun is shard {rerun.shard} of its run; re-run its backends whole, without "
                f"--shard, so that each backend's records come from one run")
    if not rerun.has_run_list or rerun.incomplete() or not rerun.selected:
        why = rerun.incomplete() or ("no run list" if not rerun.has_run_list else "it selected no run")
        return f"{rerun.path}: a rerun must be a complete run ({why}); run it again to the end"
    stray = sorted(set(rerun.catalog) - set(run.catalog))
    if stray:
        return (f"{rerun.path}: its catalog run {stray[0]} is not in the shards' catalog; re-run from a "
                f"checkout with the shards' backends and cases")
    for backend in sorted(_backends(rerun.selected)):
        mine = {rid for rid in rerun.selected if parse_run_id(rid)[0] == backend}
        theirs = {rid for rid in run.selected if parse_run_id(rid)[0] == backend}
        if mine != theirs:
            return (f"{rerun.path}: selected {len(mine)} runs of {backend}, not the {len(theirs)} the shards "
                    f"selected (first differing: {sorted(mine ^ theirs)[0]}); a rerun replaces whole backends: "
                    f"re-run {backend} with the shards' --mode, --exec, --case-set and --cases, narrowed by "
                    f"--backend only")
    return ""


def _commit(rerun: ResultsFile) -> str:
    """The one kit commit that judged `rerun`'s records; RerunError where they name none or several."""
    commits = _values(rerun, "kit_commit").get("the kit commit", ())
    if len(commits) != 1:
        raise RerunError(f"{rerun.path}: a rerun's records must name one kit commit, not "
                         f"{', '.join(commits) or 'none'}; give the results file the re-run wrote, not a committed one")
    return commits[0]


def _replace(run: ResultsFile, rerun: ResultsFile, shards: Sequence[ResultsFile]) -> None:
    """`run`'s records of the backends `rerun` ran again replaced by its own, the rerun recorded;
    RerunError where it cannot replace them."""
    backends = _backends(rerun.selected)
    kept = [dataclasses.replace(f, records=[r for r in f.records if r.backend not in backends]) for f in shards]
    problem = _not_whole(run, rerun) or _disagreement([*kept, rerun], RERUN_AGREEMENT)
    if problem:
        raise RerunError(problem)
    run.reruns.append(Rerun(tuple(sorted(backends)), _commit(rerun)))
    run.records = [r for r in run.records if r.backend not in backends] + rerun.records


def _not_one_rerun_each(reruns: Sequence[ResultsFile]) -> None:
    """RerunError where two reruns ran one backend: its records would come from two runs."""
    owner: Dict[str, str] = {}
    for rerun in reruns:
        for backend in sorted(_backends(rerun.selected)):
            if backend in owner:
                raise RerunError(f"{owner[backend]} and {rerun.path} both re-ran {backend}; give one rerun per "
                                 f"backend, its whole selection in one run")
            owner[backend] = rerun.path
