"""DECODE: one new token per request; seq_lens = prefix + 1 (the new token counted)."""
from __future__ import annotations

from kit.modes import ForwardMode
from kit.engine.modes.rules import ModeRules, RequestShape, causal


class Decode(ModeRules):
    mode = ForwardMode.DECODE
    new_help = "always 1"

    def validate(self, case):
        problem = super().validate(case)
        if problem is None and case.new != 1:
            problem = "DECODE has exactly one new token per request (new=1)"
        return problem

    def request(self, case, prefix, new, rng):
        return RequestShape(n_old=prefix, n_new=1, seq_len=prefix + 1, q_pos=[prefix], visible=causal(prefix, 1))

    def draw_new(self, draw, d):
        return dict(new=1)


RULES = Decode()
