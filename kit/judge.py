"""A verdict: the checks of one eager run or one replay (kit/verdicts.py, kit/guard.py),
and the failure class they add up to. A new check is one more entry in a list below."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from kit.fixture import Fixture
from kit.guard import GuardCheck
from kit.pools import CASE_LAYER_ID
from kit.record import GRAPH, KERNEL, KV_WRITE
from kit.reference import attention
from kit.verdicts import check_form, check_kv, check_output, check_padding

# When several checks fail, the class that says where to look first: a wrong KV pool
# explains a wrong output, not the other way round.
PRECEDENCE = (KV_WRITE, KERNEL, GRAPH)


@dataclasses.dataclass
class Verdict:
    checks: list  # output first, then the KV pool and the output's form, then the run kind's own checks

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def text(self) -> str:
        return "; ".join(c.describe() for c in self.checks if not (c.quiet and c.ok))

    @property
    def max_err(self) -> float:
        return self.checks[0].max_err

    @property
    def tol(self) -> float:
        return self.checks[0].tol

    def failure_class(self, eager_is_right: bool = False) -> str:
        """The run's class; with eager_is_right, the class of a replay whose batch runs right eagerly."""
        classes = {c.graph_class if eager_is_right else c.failure_class for c in self.checks if not c.ok}
        return min(classes, key=PRECEDENCE.index)

    @property
    def needs_eager_diagnosis(self) -> bool:
        """False when only replay-only checks fail (padded rows: eager has none to compare)."""
        return any(not c.ok and not c.replay_only for c in self.checks)


def _judged(fx: Fixture, out, before) -> list:
    golden = attention(fx, torch.float64)
    same_dtype = attention(fx, fx.case.torch_dtype)
    return [check_output(out, golden, same_dtype, fx.case.torch_dtype),
            check_kv(fx.pools.token_to_kv_pool, before[0], before[1], CASE_LAYER_ID,
                     fx.batch.out_cache_loc, fx.k_new, fx.v_new),
            check_form(out, fx.q)]


def eager_verdict(fx: Fixture, out, before, memory: GuardCheck) -> Verdict:
    return Verdict(_judged(fx, out, before) + [memory])


def replay_verdict(fx: Fixture, out, before, padded) -> Verdict:
    return Verdict(_judged(fx, out, before) + [check_padding(padded, fx.pools.token_to_kv_pool)])


def replay_failure(replay: Verdict, eager: Optional[Verdict]) -> Tuple[str, str]:
    """(class, the explanation after the replay's text) of a failing replay; `eager` is the
    same batch run eagerly on a fresh backend, when the replay's failure calls for it."""
    if eager is None:
        cls = replay.failure_class()
        return cls, f" -> {cls}"
    if eager.ok:
        cls = replay.failure_class(eager_is_right=True)
        return cls, f"; eager on the same batch is right -> {cls}"
    cls = eager.failure_class()
    return cls, f"; eager on the same batch is wrong too ({eager.text}) -> {cls}"
