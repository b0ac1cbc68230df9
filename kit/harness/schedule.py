"""Which batches one run is made of, all derived from the case in its config:
an eager run is a sequence on one backend instance ending with the case, a
graph run the replay schedule (SPEC "Graph mode"); and the buckets graphs are
captured for."""
from __future__ import annotations

import random
from typing import List, Sequence

from kit.engine.case import Case
from kit.modes import Exec
from kit.engine.modes import rules_for
from kit.engine.modes.rules import GraphBuckets

BS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = tuple(16 << i for i in range(12))  # 16 .. 32768


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest graph bucket {buckets[-1]}")


def variant(case: Case, bs: int, salt: int, new=None, tag: str = "replay") -> Case:
    """Same config, other batch size and lengths (prefixes cycled from the case, each
    longer; `new` cycled from the case unless given)."""
    rng = random.Random(case.rng_seed(100 + salt))
    n = case.bs
    prefix = tuple(case.prefix[i % n] + rng.randint(1, 2 * case.page + 3) for i in range(bs))
    if new is None:
        new = case.new if isinstance(case.new, int) else tuple(case.new[i % n] for i in range(bs))
    return case.with_(name=f"{case.name}~{tag}{salt}", prefix=prefix, new=new, seed=case.seed + salt)


def token_bucket_pairs(case: Case) -> List[Case]:
    """EXTEND graphs are per token bucket, and production replays one with any batch whose
    tokens fit it: each pair is captured with its first batch and replayed with the
    second, of another request count (16 x 1 then 2 x 8: fewer requests; 1 x 32 then
    8 x 4: more)."""
    return [variant(case, 16, 4, new=(1,) * 16), variant(case, 2, 5, new=(8, 8)),
            variant(case, 1, 6, new=(32,)), variant(case, 8, 7, new=(4,) * 8)]


def replay_schedule(case: Case) -> List[Case]:
    """Batches replayed, in order. Batch-size graphs: a larger bucket first, then the case
    (smaller after larger), then a bs-1 batch, then the case's bucket again with other
    lengths. Token graphs: the bucket pairs (they capture those buckets; other request
    counts, a bs-1 batch among them), then the case, then its shape with other lengths."""
    if rules_for(case.mode).graph is GraphBuckets.TOKEN_COUNT:
        return token_bucket_pairs(case) + [case, variant(case, case.bs, 3)]
    bucket = bucket_for(case.bs, BS_BUCKETS)
    larger = [b for b in BS_BUCKETS if b > bucket][:1]
    schedule = [variant(case, b, 1) for b in larger] + [case]
    if case.bs > 1:
        schedule.append(variant(case, 1, 2))
    schedule.append(variant(case, case.bs, 3))
    return schedule


def eager_sequence(case: Case) -> List[Case]:
    """One backend instance, as an engine keeps it: a batch of another shape, one of the
    case's shape (batch size and tokens) with other lengths, then the case itself."""
    return [variant(case, case.bs + 2, 8, tag="step"), variant(case, case.bs, 9, tag="step"), case]


def batches(case: Case, exec_: Exec) -> List[Case]:
    return eager_sequence(case) if exec_ is Exec.EAGER else replay_schedule(case)
