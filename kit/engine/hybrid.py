"""A hybrid model's step (kit.engine.kinds.recurrent: a case with a `layer_pattern`): its full-attention
layers are a softmax case of the same requests (`attention_case`), built, installed and judged as
every softmax case is (kit.engine.fixture), and its linear layers the recurrent step's
(kit.engine.recurrent_step); one batch carries both halves (`HybridBatch`), as an engine's one
ForwardBatch carries the KV pool's fields and the state pools'."""
from __future__ import annotations

import dataclasses
from typing import Tuple

from kit.engine.batch import ForwardBatch
from kit.engine.case import Case
from kit.engine.kinds.recurrent import RecurrentCase
from kit.engine.recurrent_step import RecurrentBatch


def attention_case(case: RecurrentCase) -> Case:
    """The full-attention layers' case: the hybrid's requests (a saved state's `prefix` tokens are the
    request's cached K/V), its mode, dtype and seed, dense GQA of its attention heads."""
    return Case(f"{case.name}_full", case.mode, case.prefix, case.new, heads=case.attention_heads,
                head_dim=case.attention_head_dim, dtype=case.dtype, seed=case.seed)


@dataclasses.dataclass
class HybridBatch:
    """What a hybrid backend's init_forward_metadata and every layer's forward are handed: the step's
    batch as the full-attention layers read it (the KV pool's fields, rendered for the backend's
    profile) and as the linear ones read it (their state slots)."""

    attention: ForwardBatch
    recurrent: RecurrentBatch
    full_attn_layers: Tuple[int, ...]  # the layer ids of the full-attention layers (the rest are linear)

    @property
    def forward_mode(self):
        return self.recurrent.forward_mode
