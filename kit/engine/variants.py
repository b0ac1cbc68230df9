"""Other batches of a case's config, for the batches a run is made of (each mode's rules:
ModeRules.eager_sequence, .replay_schedule), and the graph bucket a size falls in."""
from __future__ import annotations

import random
from typing import Sequence


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest graph bucket {buckets[-1]}")


def variant(case, bs: int, salt: int, new=None, tag: str = "replay"):
    """A case (kit.engine.case.Case) of the same config, other batch size and lengths (prefixes
    cycled from the case, each longer; `new` cycled from the case unless given), its requests' data
    its own."""
    rng = random.Random(case.rng_seed(100 + salt))
    n = case.bs
    prefix = tuple(case.prefix[i % n] + rng.randint(1, 2 * case.page + 3) for i in range(bs))
    if new is None:
        new = case.new if isinstance(case.new, int) else tuple(case.new[i % n] for i in range(bs))
    return case.with_(name=f"{case.name}~{tag}{salt}", prefix=prefix, new=new, seed=case.seed + salt,
                      request_seeds=None)
