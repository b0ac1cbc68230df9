"""What a runner mode is made of: the base of every kit/engine/modes/<mode>.py.

A mode says which cases it takes, how a request of a case is planned (the SPEC seq_lens table:
cached and new tokens, seq_len, positions, visibility), which ForwardBatch fields it fills, its
speculative inputs for real and padded rows alike, how a graph's padded request reads, the steps
a batch is made of, which graph contract it follows, the batches an eager run and a graph run
are made of, how the fuzzer draws its `new` field and what a drawn case's name says of it. A new mode is its rules file (this
class's subclass, named RULES) and its catalog file, cases/<mode>.py.
"""
from __future__ import annotations

import dataclasses
import enum
import random
from typing import Dict, List, Optional, Tuple

import torch

from kit.engine.batch import SpeculativeConfig
from kit.engine.drafts import num_steps
from kit.engine.transfer import to_device
from kit.engine.variants import alone, bucket_for, carrying, variant


class GraphBuckets(enum.Enum):
    """A mode's graph contract: one graph per batch-size bucket (a fixed number of tokens per
    request), or the token axis padded to a token bucket (EXTEND's piecewise contract)."""

    BATCH_SIZE = "batch_size"
    TOKEN_COUNT = "token_count"


@dataclasses.dataclass
class RequestShape:
    """One request of a batch, per its mode's conventions."""

    n_old: int  # tokens whose KV is in the pool before the call
    n_new: int  # tokens this call attends from and writes KV for
    seq_len: int  # the seq_lens entry
    q_pos: List[int]  # position of each new token
    visible: torch.Tensor  # bool [n_new, n_old + n_new], before the sliding window
    parents: List[int] = dataclasses.field(default_factory=list)  # tree verify: parent draft, -1 = root


def causal(n_old: int, n_new: int) -> torch.Tensor:
    q = torch.arange(n_new).unsqueeze(1) + n_old
    k = torch.arange(n_old + n_new).unsqueeze(0)
    return k <= q


def extend_fields(plan, device) -> dict:
    """The extend_* ForwardBatch fields of a batch whose requests add tokens to a cached
    prefix, as SGLang's ForwardBatch.init_new fills them for every extend-like mode."""
    new = [r.n_new for r in plan.requests]
    old = [r.n_old for r in plan.requests]
    i32 = lambda values: to_device(values, device, torch.int32)  # noqa: E731
    return dict(extend_num_tokens=sum(new), extend_seq_lens=i32(new), extend_prefix_lens=i32(old),
                extend_start_loc=i32([sum(new[:i]) for i in range(len(new))]),
                extend_seq_lens_cpu=new, extend_prefix_lens_cpu=old)


# The ForwardBatch fields extend_fields fills per request (device tensors a graph keeps static copies of).
EXTEND_REQUEST_FIELDS = ("extend_seq_lens", "extend_prefix_lens", "extend_start_loc")


SPECULATIVE_MODES = "TARGET_VERIFY, DRAFT_EXTEND_V2 and DRAFT_DECODE"

def draw_draft(draw, d, min_steps: int, trees: bool = True) -> Dict:
    """A drawn speculative config (kit.fuzz.strategies; `d` the Drawing): a chain (topk 1, steps + 1
    draft tokens) or, where `trees`, a tree of topk > 1 and a draft count of its own, as SGLang's
    tree configs set it apart from the steps."""
    from hypothesis import strategies as st  # the fuzzer's: only where it draws

    steps = draw(st.integers(min_steps, max(min_steps, d.size.max_drafts - 1)))
    topk = draw(st.integers(1, d.max_topk)) if trees and steps >= 1 else 1
    if topk == 1:
        return dict(new=steps + 1)
    return dict(new=draw(st.integers(2, topk * steps + 1)), topk=topk, steps=steps)


class ModeRules:
    mode = None  # the ForwardMode this file defines
    graph = GraphBuckets.BATCH_SIZE
    # EAGLE's draft fields apply (topk > 1 and steps): `new` is the server's draft token count,
    # and a backend is built with the speculative config (speculative_config).
    speculative = False
    # A backend that does not list its modes (`modes = (...)`) is taken to run this one:
    # true for the modes the protocol started with, false for any added since.
    assumed_supported = True
    new_help = ""  # what `Case.new` holds in this mode (for errors and `kit list`)

    def graph_mode(self):
        """The mode a graph's batches are handed to the backend in: this one, but where engines
        replay this mode on another mode's graphs (MIXED on EXTEND's token graphs)."""
        return self.mode

    # ---- cases ---------------------------------------------------------------------------------
    def validate(self, case) -> Optional[str]:
        """A problem with a case of this mode, or None."""
        if not isinstance(case.new, int) or case.new < 1:
            return f"{self.mode.name} takes one int >= 1 for `new` ({self.new_help})"
        return self.draft_problem(case)

    def draft_problem(self, case) -> Optional[str]:
        """A problem with the case's speculative fields (topk, steps) in this mode, or None: what
        the mode needs; how an engine counts its drafts is its profile's (kit.engine.drafts)."""
        if self.speculative:
            return None
        if case.topk != 1:
            return f"topk > 1 only applies to the speculative modes ({SPECULATIVE_MODES})"
        if case.steps is not None:
            return f"steps only applies to the speculative modes ({SPECULATIVE_MODES})"
        return None

    def request(self, case, prefix: int, new: int, rng: random.Random) -> RequestShape:
        """One request of `case` with `prefix` tokens cached and `new` (its entry of case.new)."""
        raise NotImplementedError

    def tokens_per_request(self, case) -> int:
        """Query tokens of each request (batch-size graphs size their buffers by it)."""
        return case.new

    def decode_rows(self, case) -> int:
        """How many of the case's rows, its last ones, are decode rows (a ragged step's: MIXED's)."""
        return 0

    def decode_tokens(self, case) -> int:
        """The query tokens of each of the case's decode rows (1; 1 + the drafts where they verify)."""
        return 1

    def speculative_config(self, case) -> Optional[SpeculativeConfig]:
        """The server's speculative config a backend is built with in this mode, or None."""
        if not self.speculative:
            return None
        return SpeculativeConfig(algorithm="EAGLE", num_draft_tokens=case.new, topk=case.topk,
                                 num_steps=num_steps(case))

    # ---- batches -------------------------------------------------------------------------------
    def batch_fields(self, plan, device) -> dict:
        """ForwardBatch fields this mode fills beyond the common ones."""
        return {}

    def spec_info(self, case, rows: int, real_rows: int, real_mask: Optional[torch.Tensor], fill: int, device):
        """Speculative inputs for `rows` requests: the first `real_rows` real (with their
        custom mask, where the mode has one), the rest padded rows of seq_len `fill`."""
        return None

    def padded_lens(self, case, seq_len: int) -> Tuple[int, int]:
        """(cached, new) tokens of a graph's padded request whose seq_lens entry is `seq_len`, where
        it reads as a real one does (kit.engine.common.render): a real request's query tokens, and
        seq_len counting them, as this mode's requests count theirs."""
        new = self.tokens_per_request(case)
        return max(seq_len - new, 0), new

    # ---- steps ---------------------------------------------------------------------------------
    multi_step = False  # a batch is several forwards (steps), each with its own batch (step_batch)

    def step_batches(self, batch, count: int) -> list:
        """The batches the `count` steps of a program over `batch` hand forward(): the batch itself
        in a single-step mode, else each step's (derived from it: step_batch)."""
        return [self.step_batch(batch, i) for i in range(count)] if self.multi_step else [batch]

    def steps(self, plan) -> list:
        """The plans of the forwards a batch is made of, in order (each a BatchPlan whose requests
        the reference judges); one forward, the batch itself, but in a multi-step mode."""
        return [plan]

    def step_batch(self, batch, index: int):
        """The ForwardBatch forward() gets in step `index` of a multi-step batch, derived from the
        batch the metadata hooks got (views and device operations only: a graph records them)."""
        raise NotImplementedError(f"{self.mode.value} is a single-step mode")

    # ---- runs ----------------------------------------------------------------------------------
    def eager_sequence(self, case) -> list:
        """One backend instance, as an engine keeps it: a batch of another shape (carrying the case's
        recurring request, kit.engine.variants), one of the case's shape (batch size and tokens) with
        other lengths, the case itself, then the recurring request alone."""
        sequence = [carrying(case, variant(case, case.bs + 2, 8, tag="step")), variant(case, case.bs, 9, tag="step"),
                    case]
        return sequence + ([self.alone(case, 10, tag="step")] if case.bs > 1 else [])

    def alone(self, case, salt: int, tag: str = "replay"):
        """The case's recurring request in a batch of its own (kit.engine.variants.alone)."""
        return alone(case, salt, tag)

    def replay_schedule(self, case, profile) -> list:
        """Batches replayed, in order: a larger bucket first (of the engine's batch sizes; carrying the
        case's recurring request), then the case (smaller after larger), then the recurring request
        alone (bucket 1), then the case's bucket again with other lengths."""
        sizes = profile.batch_sizes
        bucket = bucket_for(case.bs, sizes)
        larger = [b for b in sizes if b > bucket][:1]
        schedule = [carrying(case, variant(case, b, 1)) for b in larger] + [case]
        if case.bs > 1:
            schedule.append(self.alone(case, 2))
        schedule.append(variant(case, case.bs, 3))
        return schedule

    # ---- the fuzzer ----------------------------------------------------------------------------
    def draw_new(self, draw, d) -> Dict:
        """The `new` (and topk, steps) fields of a drawn case (kit.fuzz.strategies: `d` the Drawing),
        and `prefix` where the mode bounds what the batch drew (a MIXED decode row has one)."""
        from hypothesis import strategies as st  # the fuzzer's: only where it draws
        return dict(new=draw(st.integers(1, d.size.max_drafts)))

    def name_tag(self, fields: Dict) -> Optional[str]:
        """What a drawn case's name says of this mode's fields (e.g. "chain4"), or None."""
        return None
