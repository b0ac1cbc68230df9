"""Which batches one run is made of: the case itself for an eager run; for a graph
run, the replay schedule (SPEC "Graph mode"), batches derived from the case in
the same config, and the buckets graphs are captured for."""
from __future__ import annotations

import random
from typing import List, Sequence

from kit.case import Case
from kit.modes import Exec

BS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = tuple(16 << i for i in range(12))  # 16 .. 32768


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest graph bucket {buckets[-1]}")


def variant(case: Case, bs: int, salt: int) -> Case:
    """Same config, other batch size and lengths (cycled from the case, each longer)."""
    rng = random.Random(case.rng_seed(100 + salt))
    n = case.bs
    prefix = tuple(case.prefix[i % n] + rng.randint(1, 2 * case.page + 3) for i in range(bs))
    new = case.new if isinstance(case.new, int) else tuple(case.new[i % n] for i in range(bs))
    return case.with_(name=f"{case.name}~replay{salt}", prefix=prefix, new=new, seed=case.seed + salt)


def replay_schedule(case: Case) -> List[Case]:
    """Batches replayed, in order: a larger bucket first, then the case (smaller after
    larger), then a bs-1 batch, then the case's bucket again with other lengths."""
    bucket = bucket_for(case.bs, BS_BUCKETS)
    larger = [b for b in BS_BUCKETS if b > bucket][:1]
    schedule = [variant(case, b, 1) for b in larger] + [case]
    if case.bs > 1:
        schedule.append(variant(case, 1, 2))
    schedule.append(variant(case, case.bs, 3))
    return schedule


def batches(case: Case, exec_: Exec) -> List[Case]:
    return [case] if exec_ is Exec.EAGER else replay_schedule(case)
