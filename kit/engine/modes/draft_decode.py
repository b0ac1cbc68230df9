"""DRAFT_DECODE: the EAGLE draft model decoding its steps, all of them on metadata built once
(SGLang: EagleDraftWorker.draft_forward, eagle_worker_v2.py:742-923, over a multi-step draft
backend: TritonMultiStepDraftBackend, FlashInferMultiStepDraftBackend; its ForwardMode.DECODE).

A case's `new` is the server's draft token count N, `topk` the lanes K each request drafts,
`steps` the draft's steps S (None: N - 1, a chain's), `prefix` each request's committed length.
Each request owns K lanes of S columns past its committed tokens: lane k's step s writes and
reads req_to_token[row, seq_len + k*S + s] (SGLang's layout at page 1 or K = 1,
assign_draft_cache_locs_contiguous; cases with pages > 1 and K > 1 are out of scope, below). The
batch the metadata hooks get: batch_size = bs, seq_lens = the committed lengths, out_cache_loc
[bs*K*S] in (request, lane, column) order, positions [bs*K] = seq_len per lane, spec_info (topk,
num_steps, draft_token_num). Then S - 1 steps, each a forward over bs*K rows: step i's batch is the
same but for out_cache_loc (column i of every lane), positions (seq_len + i) and
spec_info.draft_step = i; column S - 1 is never written. Row (b, k) of step i attends b's
committed tokens, then its own lane's columns 0..i: a causal decode at position seq_len + i.

Its own lane, not the tree's true ancestors: SGLang's worker picks each step's K best children of
all K*K candidates (spec_utils.py select_top_k_tokens), so a lane's token may descend from another
lane, yet attention reads the lane's own columns (generate_draft_decode_kv_indices, no KV reorder
between steps): that is the contract a draft backend implements; the tree is the verify's.

Pages > 1 with K > 1, which SGLang's draft rule refuses (kit.engine.drafts): SGLang aligns each
lane to a page of its own and copies the request's partial last page into every lane's region
before the draft runs (eagle_worker_common.py:308-346, duplicate_prefix_tail_to_draft_branches): the
pool then holds a prefix token at two slots, a state the worker makes, which the kit's plan (one
slot per token) does not hold.
"""
from __future__ import annotations

import dataclasses
from typing import List

import torch

from kit.engine.batch import SpecInfo
from kit.engine.drafts import num_steps
from kit.engine.modes.rules import ModeRules, RequestShape, draw_draft
from kit.engine.transfer import to_device
from kit.modes import ForwardMode

# Its forwards are steps - 1; SGLang builds no multi-step draft backend for fewer steps either
# (speculative/draft_utils.py:86-87).
MIN_STEPS = 2


def lane_columns(seq_len: int, lane: int, steps: int, upto: int) -> List[int]:
    """req_to_token columns of lane `lane`'s first `upto` steps (page 1 or one lane)."""
    return [seq_len + lane * steps + j for j in range(upto)]


class DraftDecode(ModeRules):
    mode = ForwardMode.DRAFT_DECODE
    speculative = True
    multi_step = True
    assumed_supported = False
    new_help = "the server's draft token count; topk lanes of `steps` columns each"

    def validate(self, case):
        problem = super().validate(case)
        if problem:
            return problem
        if num_steps(case) < MIN_STEPS:
            return (f"DRAFT_DECODE needs steps >= {MIN_STEPS}: its forwards are steps - 1 (and SGLang builds no "
                    f"multi-step draft for fewer)")
        if min(case.prefix) < 1:
            return "a DRAFT_DECODE request has committed tokens: prefix >= 1"
        return None

    def request(self, case, prefix, new, rng):
        """The request as the metadata hooks see it: its committed tokens, then every lane's
        columns; lane k's column s sits at position prefix + s and sees the prefix and the lane's
        columns up to it."""
        k_lanes, steps = case.topk, num_steps(case)
        visible = torch.zeros((k_lanes * steps, prefix + k_lanes * steps), dtype=torch.bool)
        visible[:, :prefix] = True
        for k in range(k_lanes):
            for s in range(steps):
                visible[k * steps + s, [prefix + c for c in lane_columns(0, k, steps, s + 1)]] = True
        return RequestShape(n_old=prefix, n_new=k_lanes * steps, seq_len=prefix,
                            q_pos=[prefix + s for _ in range(k_lanes) for s in range(steps)], visible=visible)

    def tokens_per_request(self, case):
        return case.topk * num_steps(case)

    def batch_fields(self, plan, device):
        n = len(plan.requests)
        positions = [r.seq_len for r in plan.requests for _ in range(plan.case.topk)]
        return dict(positions=to_device(positions, device, torch.int64),
                    spec_info=self.spec_info(plan.case, n, n, None, fill=1, device=device))

    def spec_info(self, case, rows, real_rows, real_mask, fill, device):
        return SpecInfo(draft_token_num=case.new, topk=case.topk, num_steps=num_steps(case))

    def padded_lens(self, case, seq_len):
        return seq_len, self.tokens_per_request(case)  # seq_lens count the committed tokens only

    def steps(self, plan):
        """S - 1 steps; step i: one row a lane, its keys the committed tokens and lane columns 0..i."""
        case = plan.case
        k_lanes, steps = case.topk, num_steps(case)
        out = []
        for i in range(steps - 1):
            rows = []
            for r in plan.requests:
                for k in range(k_lanes):
                    keys = list(range(r.seq_len)) + lane_columns(r.seq_len, k, steps, i + 1)
                    rows.append(dataclasses.replace(
                        r, n_old=r.seq_len + i, n_new=1, q_pos=[r.seq_len + i],
                        visible=torch.ones((1, r.seq_len + i + 1), dtype=torch.bool),
                        slots=[r.slots[t] for t in keys], keys=keys))
            out.append(dataclasses.replace(plan, requests=rows))
        return out

    def step_batch(self, batch, index):
        """Step `index`'s batch: column `index` of every lane's slots, positions seq_len + index."""
        spec = batch.spec_info
        bs, lanes = batch.batch_size, spec.topk
        loc = batch.out_cache_loc[:bs * lanes * spec.num_steps].view(bs, lanes, spec.num_steps)[:, :, index]
        return dataclasses.replace(batch, out_cache_loc=loc.reshape(-1), positions=batch.positions[:bs * lanes] + index,
                                   spec_info=dataclasses.replace(spec, draft_step=index))

    def draw_new(self, draw, d):
        """A chain or a tree (trees at page 1: pages > 1 are out of scope) of steps >= 2, over
        committed prefixes >= 1."""
        drawn = draw_draft(draw, d, MIN_STEPS, trees=d.fields["page"] == 1)
        return dict(drawn, prefix=tuple(max(p, 1) for p in d.fields["prefix"]))

    def name_tag(self, fields):
        topk = fields.get("topk", 1)
        steps = fields.get("steps") or fields["new"] - 1
        return f"steps{steps}" + (f"_tree{topk}_draft{fields['new']}" if topk > 1 else "")


RULES = DraftDecode()
