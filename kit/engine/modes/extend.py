"""EXTEND: ragged new tokens per request; seq_lens = prefix + extend, with the
extend_* fields. Graphs follow the piecewise contract: the token axis padded to
a token bucket."""
from __future__ import annotations

from kit.modes import ForwardMode
from kit.engine.modes.rules import GraphBuckets, ModeRules, RequestShape, causal, extend_fields
from kit.engine.variants import variant


class Extend(ModeRules):
    mode = ForwardMode.EXTEND
    graph = GraphBuckets.TOKEN_COUNT
    new_help = "one extend length >= 1 per request"

    def validate(self, case):
        if isinstance(case.new, int) or len(case.new) != len(case.prefix) or min(case.new) < 1:
            return f"{self.mode.name} needs `new` as {self.new_help}"
        return self.draft_problem(case)

    def request(self, case, prefix, new, rng):
        return RequestShape(n_old=prefix, n_new=new, seq_len=prefix + new, q_pos=[prefix + i for i in range(new)],
                            visible=causal(prefix, new))

    def tokens_per_request(self, case):
        raise TypeError(f"{self.mode.name} requests have ragged token counts; its graphs are per token bucket")

    def batch_fields(self, plan, device):
        return extend_fields(plan, device)

    def padded_lens(self, case, seq_len):
        """A token graph's padded request holds no token (its extend lengths 0)."""
        return 0, 0

    def replay_schedule(self, case, profile):
        """Token graphs: the bucket pairs (they capture those buckets; other request counts, a bs-1
        batch among them), then the case, then its shape with other lengths, then the case's recurring
        request alone (another token bucket, kit.engine.variants)."""
        schedule = self.token_bucket_pairs(case) + [case, variant(case, case.bs, 3)]
        return schedule + ([self.alone(case, 11)] if case.bs > 1 else [])

    def token_bucket_pairs(self, case):
        """Token graphs are per token bucket, and production replays one with any batch whose tokens
        fit it: each pair is captured with its first batch and replayed with the second, of another
        request count (16 x 1 then 2 x 8: fewer requests; 1 x 32 then 8 x 4: more)."""
        return [variant(case, 16, 4, new=(1,) * 16), variant(case, 2, 5, new=(8, 8)),
                variant(case, 1, 6, new=(32,)), variant(case, 8, 7, new=(4,) * 8)]

    def draw_new(self, draw, d):
        """Ragged extend lengths; half the time the batch's token count at or around a token bucket."""
        from hypothesis import strategies as st

        s, bs = d.size, len(d.fields["prefix"])
        new = draw(st.lists(d.length(d.fields["page"], 1, s.max_new), min_size=bs, max_size=bs))
        if draw(st.booleans()):
            total = draw(st.sampled_from(d.around(d.token_buckets, sum(new[:-1]) + 1, s.max_tokens) or (sum(new),)))
            new[-1] = total - sum(new[:-1])
        return dict(new=tuple(new))


RULES = Extend()
