"""`--shard K/N`: one machine's part of a selection (the matrix, `python -m kit warmup`), and what
a shard's results file says of it. The unit is a kernel group, a backend's runs of one mode and
kernel variant: its runs share their batches and its builds (FlashInfer's JIT, Triton's compile),
so a shard's warmup builds what its matrix loads and nothing else. Pure functions of the groups
and N, whatever order they come in: every machine computes the same split. Torch-free (the
report layer reads the shard of a results file)."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Dict, Iterable, Optional


def kernel_group(label: str, mode: str, kernel_variant: str) -> str:
    """The group of a run: `--dist loadgroup` keeps it on one worker, `--shard` on one machine."""
    return f"{label}-{mode}-{kernel_variant}"


def split(groups: Iterable[str], count: int) -> Dict[str, int]:
    """Each group's shard (1..count), `groups` naming a group once per run: the group with the
    most runs first (by name among equals) goes to the shard with the fewest runs so far (the
    lowest among equals): shards differ by at most one group's runs, and a backend's groups of
    equal size, which sort together, are dealt round the shards in turn."""
    loads = [0] * count
    shard_of = {}
    for group, runs in sorted(collections.Counter(groups).items(), key=lambda item: (-item[1], item[0])):
        lightest = min(range(count), key=lambda k: (loads[k], k))
        loads[lightest] += runs
        shard_of[group] = lightest + 1
    return shard_of


def fingerprint(run_ids: Iterable[str]) -> str:
    """Of a set of run ids, in any order: equal sets, equal fingerprints."""
    return hashlib.sha256("\n".join(sorted(set(run_ids))).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`; in a results file also of which selection (the fingerprint of the
    unsharded selection's run ids) and how many runs that selection has: a merge checks that its
    shards are of one selection and make it up exactly."""

    index: int
    count: int
    selection: Optional[str] = None
    runs: Optional[int] = None

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """`K/N`, 1 <= K <= N; ValueError naming the form otherwise."""
        index, _, count = text.partition("/")
        if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
            raise ValueError(f"{text!r} is no shard: give K/N with 1 <= K <= N, e.g. 2/3")
        return cls(int(index), int(count))

    def of_selection(self, run_ids: Iterable[str]) -> "Shard":
        """This shard, saying which selection (its unsharded run ids) it is a part of."""
        ids = set(run_ids)
        return dataclasses.replace(self, selection=fingerprint(ids), runs=len(ids))

    def section(self) -> dict:
        """The `shard` of a results file's `run`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_section(cls, section) -> "Shard":
        """A results file's `shard`; ValueError where it is not one."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if not (isinstance(section, dict) and set(section) == fields and isinstance(section["selection"], str)
                and all(isinstance(section[k], int) for k in ("index", "count", "runs"))
                and 1 <= section["index"] <= section["count"]):
            raise ValueError(f"its run's shard is {section!r}, not the {', '.join(sorted(fields))} of a --shard "
                             f"K/N run")
        return cls(**section)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
