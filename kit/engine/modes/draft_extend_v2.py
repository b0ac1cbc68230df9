"""DRAFT_EXTEND_V2: num_draft_tokens new tokens per request; seq_lens = prefix +
drafts (bumped); the prefix is seq_lens - spec_info.extend_seq_lens_tensor.
Padded graph rows carry extend_seq_lens = drafts too."""
from __future__ import annotations

import torch

from kit.engine.batch import SpecInfo
from kit.modes import ForwardMode
from kit.engine.modes.rules import ModeRules, RequestShape, causal, draw_draft, extend_fields
from kit.engine.drafts import num_steps


class DraftExtendV2(ModeRules):
    mode = ForwardMode.DRAFT_EXTEND_V2
    speculative = True
    new_help = "num_draft_tokens, the same for every request"

    def request(self, case, prefix, new, rng):
        return RequestShape(n_old=prefix, n_new=new, seq_len=prefix + new, q_pos=[prefix + i for i in range(new)],
                            visible=causal(prefix, new))

    def draw_new(self, draw, d):
        """The drafts of a chain, or of a tree with a draft count of its own."""
        return draw_draft(draw, d, min_steps=0)

    def name_tag(self, fields):
        return f"draft{fields['new']}" + (f"_tree{fields['topk']}" if fields.get("topk", 1) > 1 else "")

    def batch_fields(self, plan, device):
        # The extend_* fields too: an engine's eager draft extend is an extend over the drafts
        # (SGLang's ForwardBatch.init_new fills them for every mode but decode and idle).
        n = len(plan.requests)
        return dict(spec_info=self.spec_info(plan.case, n, n, None, fill=1, device=device),
                    **extend_fields(plan, device))

    def spec_info(self, case, rows, real_rows, real_mask, fill, device):
        lens = torch.full((rows,), case.new, dtype=torch.int32, device=device)
        return SpecInfo(draft_token_num=case.new, topk=case.topk, extend_seq_lens_tensor=lens,
                        extend_seq_lens_cpu=[case.new] * rows, num_tokens_per_bs=case.new, num_steps=num_steps(case))


RULES = DraftExtendV2()
