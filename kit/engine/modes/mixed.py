"""MIXED: one batch of extend rows first (a chunk of a prompt, with or without a cached prefix)
and decode rows last (one new token each, prefix = seq_len - 1): SGLang's mixed chunked prefill
(ForwardMode.MIXED: ScheduleBatch.mix_with_running puts the running requests after the chunk),
and every step vLLM schedules. seq_lens = prefix + extend on every row, with the extend_* fields
of all rows (a decode row: prefix seq_len - 1, extend 1).

A case's decode rows are its trailing rows of one new token, after at least one extend row (a
batch of one-token rows is a one-token extend and decode rows). With `steps` k, its decode rows
verify k drafts each (1 + k tokens, causal): vLLM's speculative decoding with chunked prefill
schedules them beside prefill rows, its builders built with the speculative config (the engine's
profile says whether it schedules such steps, kit.engine.profile). Graphs follow EXTEND's token-bucket
contract, and a MIXED batch is replayed on them as SGLang's prefill graph runner replays it: on the
graph an EXTEND batch of that token bucket captured, its batch handed as EXTEND
(prefill_cuda_graph_runner.py:1952-1962)."""
from __future__ import annotations

from typing import Tuple

from kit.engine.batch import SpeculativeConfig
from kit.engine.modes.extend import Extend
from kit.engine.variants import alone, carrying, recurring, variant
from kit.modes import ForwardMode


def decode_rows(new: Tuple[int, ...], per: int = 1) -> int:
    """How many of a MIXED batch's rows (their new tokens `new`, in order) are decode rows: the
    trailing rows of `per` tokens (a decode row's), the first row always an extend row."""
    count = 0
    while count < len(new) - 1 and new[-1 - count] == per:
        count += 1
    return count


def decode_tokens(case) -> int:
    """A decode row's tokens: 1, or 1 + the drafts it verifies (`steps`)."""
    return 1 + (case.steps or 0)


def mixed_new(case, bs: int) -> Tuple[int, ...]:
    """`new` of a MIXED batch of `bs` rows (bs >= 2) shaped as the case: its extend lengths cycled
    over the first rows, then as many of its decode rows as fit after one extend row."""
    per = decode_tokens(case)
    decode = min(decode_rows(case.new, per), bs - 1)
    extend = case.new[:len(case.new) - decode_rows(case.new, per)]
    return tuple(extend[i % len(extend)] for i in range(bs - decode)) + (per,) * decode


class Mixed(Extend):
    mode = ForwardMode.MIXED
    assumed_supported = False
    new_help = "one extend length >= 1 per request, the decode rows (1) last"

    def validate(self, case):
        problem = super().validate(case)
        if problem:
            return problem
        per = decode_tokens(case)
        decode = decode_rows(case.new, per)
        if not decode:
            return f"MIXED needs at least one extend row, then at least one decode row (new={per}) last"
        short = [p for p in case.prefix[len(case.prefix) - decode:] if p < 1]
        if short:
            return f"a MIXED decode row (the trailing new={per} rows) has a prefix >= 1: its cached tokens"
        return None

    def draft_problem(self, case):
        if case.topk != 1:
            return "a MIXED decode row verifies a chain of drafts (topk 1): no engine schedules tree verify beside prefill"
        return None

    def decode_rows(self, case):
        return decode_rows(case.new, decode_tokens(case))

    def decode_tokens(self, case):
        return decode_tokens(case)

    def speculative_config(self, case):
        """The drafts its decode rows verify, where they do: a chain of `steps` drafts."""
        if not case.steps:
            return None
        return SpeculativeConfig(algorithm="EAGLE", num_draft_tokens=case.steps + 1, topk=1, num_steps=case.steps)

    def graph_mode(self):
        return ForwardMode.EXTEND

    def eager_sequence(self, case):
        """As every mode's (ModeRules.eager_sequence), the batch of two more rows mixed as the case, its
        recurring request among the rows of its kind at another position: a decode row last, an extend
        row first (second where it was first)."""
        r = recurring(case)
        at = -1 if case.new_lens[r] == decode_tokens(case) else 1 if r == 0 else 0
        larger = variant(case, case.bs + 2, 8, new=mixed_new(case, case.bs + 2), tag="step")
        return [carrying(case, larger, at), variant(case, case.bs, 9, tag="step"), case, self.alone(case, 10, "step")]

    def alone(self, case, salt, tag="replay"):
        """The recurring request alone is an EXTEND batch (a MIXED batch has an extend row and a decode
        row at least), as a scheduler hands a batch without its other rows; its graph is EXTEND's."""
        return alone(case, salt, tag, mode=ForwardMode.EXTEND, steps=None)

    def token_bucket_pairs(self, case):
        """Each token bucket captured by its first batch and replayed with the second: an EXTEND
        batch (2 x 8) captures 16 tokens and a MIXED batch of 13 rows replays it, as SGLang replays
        MIXED on the graphs EXTEND captured; a MIXED batch of 8 rows captures 32 and one of 2
        replays it."""
        per = decode_tokens(case)  # with verifying decode rows, each bucket `per` times as many tokens
        extend = variant(case.with_(mode=ForwardMode.EXTEND, steps=None), 2, 4, new=(8 * per, 8 * per))
        return [extend, variant(case, 13, 5, new=(4 * per,) + (per,) * 12),
                variant(case, 8, 6, new=(25 * per,) + (per,) * 7), variant(case, 2, 7, new=(31 * per, per))]

    def draw_new(self, draw, d):
        """Ragged extend rows, then decode rows (whose prefix is at least 1)."""
        from hypothesis import strategies as st

        prefix, bs = d.fields["prefix"], len(d.fields["prefix"])
        if bs < 2:  # one extend row and one decode row at least
            prefix, bs = prefix + (draw(d.length(d.fields["page"], 1, d.size.max_len)),), 2
        decode = draw(st.integers(1, bs - 1))
        extend = draw(st.lists(d.length(d.fields["page"], 1, d.size.max_new), min_size=bs - decode,
                               max_size=bs - decode))
        new = tuple(extend) + (1,) * decode
        tail = bs - decode_rows(new)  # a one-token extend row just before them counts as one
        return dict(new=new, prefix=prefix[:tail] + tuple(max(p, 1) for p in prefix[tail:]))

    def name_tag(self, fields):
        return f"dec{decode_rows(fields['new'])}"  # the fuzzer draws no verifying decode rows


RULES = Mixed()
