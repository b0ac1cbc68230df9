"""TARGET_VERIFY: draft_token_num drafts per request, a chain (topk 1) or a tree;
seq_lens = the committed prefix (drafts excluded); positions = seq_len + tree
depth; spec_info.custom_mask per request a row-major [draft, seq_len + draft]
bool block (True = attend), blocks concatenated. Padded graph rows attend
everything of their fill-length context."""
from __future__ import annotations

import random
from typing import List

import torch

from kit.engine.batch import SpecInfo
from kit.modes import ForwardMode
from kit.engine.modes.rules import ModeRules, RequestShape
from kit.engine.drafts import num_steps
from kit.engine.transfer import to_device


def draft_tree(n: int, topk: int, rng: random.Random) -> List[int]:
    """Parents of a draft tree with node 0 as root; each node has <= topk children.
    topk 1 gives a chain; topk > 1 always branches at the root (nodes 1 and 2)."""
    parents, children = [-1], [0] * n
    for i in range(1, n):
        if topk == 1:
            p = i - 1
        elif i <= 2:
            p = 0
        else:
            p = rng.choice([j for j in range(i) if children[j] < topk])
        parents.append(p)
        children[p] += 1
    return parents


def ancestry(parents: List[int]) -> torch.Tensor:
    """[n, n] bool: node i sees node j iff j is i or one of its ancestors."""
    n = len(parents)
    anc = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    return anc


def depths(parents: List[int]) -> List[int]:
    depth: List[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


class TargetVerify(ModeRules):
    mode = ForwardMode.TARGET_VERIFY
    speculative = True
    new_help = "draft_token_num, the same for every request"

    def request(self, case, prefix, new, rng):
        parents = draft_tree(new, case.topk, rng)
        visible = torch.cat([torch.ones((new, prefix), dtype=torch.bool), ancestry(parents)], dim=1)
        return RequestShape(n_old=prefix, n_new=new, seq_len=prefix, q_pos=[prefix + d for d in depths(parents)],
                            visible=visible, parents=parents)

    def padded_lens(self, case, seq_len):
        return seq_len, case.new  # seq_lens count the committed tokens only

    def draw_new(self, draw, d):
        """Drafts, a chain or a tree."""
        from hypothesis import strategies as st
        return dict(new=draw(st.integers(1, d.size.max_drafts)), topk=draw(st.integers(1, d.max_topk)))

    def name_tag(self, fields):
        return ("tree" if fields.get("topk", 1) > 1 else "chain") + str(fields["new"])

    def batch_fields(self, plan, device):
        mask = to_device(torch.cat([r.visible.reshape(-1) for r in plan.requests]), device)
        n = len(plan.requests)
        return dict(spec_info=self.spec_info(plan.case, n, n, mask, fill=1, device=device))

    def spec_info(self, case, rows, real_rows, real_mask, fill, device):
        draft = case.new
        pad = torch.ones((rows - real_rows) * draft * (fill + draft), dtype=torch.bool, device=device)
        mask = pad if real_mask is None else torch.cat([real_mask, pad])
        return SpecInfo(draft_token_num=draft, topk=case.topk, custom_mask=mask, num_steps=num_steps(case))


RULES = TargetVerify()
