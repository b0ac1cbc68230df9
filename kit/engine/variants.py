"""Other batches of a case's config, for the batches a run is made of (each mode's rules:
ModeRules.eager_sequence, .replay_schedule), and the graph bucket a size falls in. Some carry one of
the case's requests again (its seed and lengths: the same data, bit for bit), at another position,
beside other requests or alone, so that a run compares its output rows from batch to batch
(kit.harness.invariance)."""
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


def recurring(case) -> int:
    """The case's request that recurs in the run's other batches: the one with the most keys (the
    most KV splits, where a backend splits)."""
    return max(range(case.bs), key=lambda i: (case.prefix[i] + case.new_lens[i], -i))


def carrying(case, other, at: int = -1):
    """`other` (a batch of the case's config) with its request `at` (the last by default) replaced by
    the case's recurring one: its position, neighbours and pages change, its data stays."""
    r, at = recurring(case), at % other.bs

    def put(values, value):
        return values[:at] + (value,) + values[at + 1:]
    new = other.new if isinstance(other.new, int) else put(other.new, case.new_lens[r])
    return other.with_(prefix=put(other.prefix, case.prefix[r]), new=new,
                       request_seeds=put(tuple(other.request_seed(i) for i in range(other.bs)), case.request_seed(r)))


def alone(case, salt: int, tag: str = "replay", mode=None, **fields):
    """The case's recurring request alone, in a batch (its pages, its row) of its own; `mode` (and
    `fields` of it): the batch's, where a batch of one request is not one of the case's mode."""
    r = recurring(case)
    return case.with_(name=f"{case.name}~{tag}{salt}", mode=mode or case.mode, prefix=(case.prefix[r],),
                      new=case.new if isinstance(case.new, int) else (case.new_lens[r],), seed=case.seed + salt,
                      request_seeds=(case.request_seed(r),), **fields)
