"""EXTEND: ragged new tokens per request; seq_lens = prefix + extend, with the
extend_* fields. Graphs follow the piecewise contract: the token axis padded to
a token bucket."""
from __future__ import annotations

from kit.modes import ForwardMode
from kit.engine.modes.rules import GraphBuckets, ModeRules, RequestShape, causal, extend_fields



class Extend(ModeRules):
    mode = ForwardMode.EXTEND
    graph = GraphBuckets.TOKEN_COUNT
    new_help = "one extend length >= 1 per request"

    def validate(self, case):
        if isinstance(case.new, int) or len(case.new) != len(case.prefix) or min(case.new) < 1:
            return f"EXTEND needs `new` as {self.new_help}"
        if case.topk != 1:
            return "topk > 1 only applies to TARGET_VERIFY"
        return None

    def request(self, prefix, new, topk, rng):
        return RequestShape(n_old=prefix, n_new=new, seq_len=prefix + new, q_pos=[prefix + i for i in range(new)],
                            visible=causal(prefix, new))

    def tokens_per_request(self, case):
        raise TypeError("EXTEND requests have ragged token counts; its graphs are per token bucket")

    def batch_fields(self, plan, device):
        return extend_fields(plan, device)


RULES = Extend()
