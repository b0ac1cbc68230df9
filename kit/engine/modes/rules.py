"""What a runner mode is made of: the base of every kit/engine/modes/<mode>.py.

A mode says which cases it takes, how a request of a case is planned (the
SPEC seq_lens table: cached and new tokens, seq_len, positions, visibility),
which ForwardBatch fields it fills, its speculative inputs for real and padded
rows alike, and which graph contract it follows.
"""
from __future__ import annotations

import dataclasses
import enum
import random
from typing import List, Optional

import torch

from kit.engine.transfer import to_device


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


class ModeRules:
    mode = None  # the ForwardMode this file defines
    graph = GraphBuckets.BATCH_SIZE
    # A backend that does not list its modes (`modes = (...)`) is taken to run this one:
    # true for the modes the protocol started with, false for any added since.
    assumed_supported = True
    new_help = ""  # what `Case.new` holds in this mode (for errors and `kit list`)

    def validate(self, case) -> Optional[str]:
        """A problem with a case of this mode, or None."""
        if not isinstance(case.new, int) or case.new < 1:
            return f"{self.mode.name} takes one int >= 1 for `new` ({self.new_help})"
        if case.topk != 1:
            return "topk > 1 only applies to TARGET_VERIFY"
        return None

    def request(self, prefix: int, new: int, topk: int, rng: random.Random) -> RequestShape:
        raise NotImplementedError

    def tokens_per_request(self, case) -> int:
        """Query tokens of each request (batch-size graphs size their buffers by it)."""
        return case.new

    def speculative_config(self, case):
        """The server's speculative config a backend is built with in this mode, or None."""
        return None

    def batch_fields(self, plan, device) -> dict:
        """ForwardBatch fields this mode fills beyond the common ones."""
        return {}

    def spec_info(self, case, rows: int, real_rows: int, real_mask: Optional[torch.Tensor], fill: int, device):
        """Speculative inputs for `rows` requests: the first `real_rows` real (with their
        custom mask, where the mode has one), the rest padded rows of seq_len `fill`."""
        return None
