"""An engine's conventions, as a profile every backend (or its adapter) declares (`profile = ...`;
none is assumed): how its KV cache stores each attention kind (kit.engine.storage), which converter
renders its batch from the kit's step description (kit.engine.render), what a padded row of a graph
batch holds and whether it may write KV, the batch sizes and token counts it captures graphs for,
and how its graph metadata hooks are driven. The pools, the graph
harness, the KV check and the replay schedule read the profile; none of them assumes an engine.
A new engine is an adapter plus its profile."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

from kit.engine import drafts

# SGLang's CUDA-graph batch sizes, and the token buckets of its piecewise prefill graphs.
SGLANG_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SGLANG_TOKEN_BUCKETS = tuple(16 << i for i in range(12))  # 16 .. 32768

# How a backend's graph metadata hooks are driven (kit.harness.hooks).
TWO_PHASE, CAPTURE_REPLAY, BUILDER = "two-phase", "capture/replay", "builder"
# Which converter renders a step's batch (kit.engine.render): SGLang's ForwardBatch; that and the
# step in vLLM's CommonAttentionMetadata terms (`batch.common`, which builder hooks read); that and
# the step description itself (`batch.step`, kit.engine.plan), which the in-box torch_native reads.
FORWARD_BATCH, COMMON, STEP = "forward_batch", "common", "step"
SCRATCH_SLOT = 0  # a padded token writes its KV here (SGLang); its pages are never a request's
# The order a ragged step's rows (EXTEND, MIXED) are handed in (kit.engine.plan.row_order): as the
# scheduler lists them (SGLang: the chunk's extend rows, then the running decode rows), or decode
# rows first (vLLM's runner, reorder_batch_to_split_decodes_and_prefills, which its builders'
# split_decodes_and_prefills relies on).
AS_SCHEDULED, DECODE_FIRST = "as scheduled", "decode first"
ROW_ORDERS = (AS_SCHEDULED, DECODE_FIRST)
NO_WRITE = -1  # a padded token writes no KV (vLLM's slot_mapping)
# How a recurrent layer's verify keeps each draft's state and where the next step continues from
# (kit.harness.recurrent_rules): SGLang's intermediate pools, copied into the slot by the scheduler;
# vLLM's state block per token, read back by num_accepted_tokens.
INTERMEDIATE_POOLS, PER_TOKEN_BLOCKS = "intermediate pools", "per-token blocks"


@dataclasses.dataclass(frozen=True)
class EngineProfile:
    name: str
    storage: Dict[str, str]  # attention kind -> KV storage layout (kit.engine.storage.STORAGES)
    batch: str = FORWARD_BATCH  # the converter of its batches: FORWARD_BATCH, COMMON or STEP
    # A padded token's KV slot in a graph batch: SCRATCH_SLOT (written, never read for real rows)
    # or NO_WRITE (the backend must skip it; any write is a stray one).
    padded_slot: int = SCRATCH_SLOT
    # A padded request's seq_len in a graph batch: None for the backend's fill value
    # (get_cuda_graph_seq_len_fill_value, SGLang's), else this (vLLM: 0, an empty request).
    padded_seq_len: Optional[int] = None
    # A padded request's query tokens in a graph batch: None for a real request's count in its mode
    # (SGLang's padded rows decode or verify as real ones do); 0 for an empty request, whose query
    # starts where the real tokens end (vLLM's runner, v1/worker/gpu/model_runner.py:1468).
    padded_query_len: Optional[int] = None
    # Whether a token-bucket graph is captured for as many requests as its bucket has tokens (up to
    # the largest batch) and its replays pad their requests to that count, as vLLM's full graphs of
    # mixed batches do (v1/worker/gpu/cudagraph_utils.py:369); else a replay hands the batch's own
    # requests (SGLang's prefill graphs, which leave attention out of the graph).
    pads_token_graph_requests: bool = False
    batch_sizes: Tuple[int, ...] = SGLANG_BATCH_SIZES  # graphs captured per batch-size bucket
    token_buckets: Tuple[int, ...] = SGLANG_TOKEN_BUCKETS  # graphs of ragged batches, per token bucket
    # The hook style; None: whichever of SGLang's two the backend implements (kit.harness.capabilities).
    hooks: Optional[str] = None
    row_order: str = AS_SCHEDULED  # a ragged step's row order (ROW_ORDERS)
    # Whether it schedules decode rows that verify drafts (1 + k tokens) beside prefill rows in one
    # step (vLLM, speculative decoding with chunked prefill); SGLang verifies in steps of their own.
    spec_rows_beside_prefill: bool = False
    # Runs of a graph's program before its capture: SGLang's graph runners warm up twice
    # (model_executor/runner/row_bucket_graph_runner.py:303), vLLM's once (v1/worker/gpu/cudagraph_utils.py:464-467;
    # V1: cudagraph_num_of_warmups, config/vllm.py:2011); what a backend plans lazily at a forward depends on it.
    capture_warmups: int = 2
    recurrent_verify: str = INTERMEDIATE_POOLS  # a recurrent layer's verify rule (INTERMEDIATE_POOLS, PER_TOKEN_BLOCKS)
    # Its draft rule (kit.engine.drafts): why it never runs a speculative case's drafts, or None;
    # None for an engine that runs every draft configuration the modes describe.
    drafts: Optional[Callable] = None

    def storage_for(self, kind: str) -> str:
        if kind not in self.storage:
            raise ValueError(f"engine profile {self.name!r} names no KV storage for {kind!r} attention")
        return self.storage[kind]

    def seq_len_pad(self, fill_value: int) -> int:
        """A padded request's seq_lens entry in a graph batch, for a backend whose fill value
        (get_cuda_graph_seq_len_fill_value) is `fill_value`."""
        return fill_value if self.padded_seq_len is None else self.padded_seq_len

    @property
    def padded_rows_attend(self) -> bool:
        """Whether a padded token belongs to a (padded) request and so has an output, which must
        be finite; an empty padded request owns no token, and no engine computes those rows."""
        return self.padded_query_len is None

    @property
    def scratch(self) -> bool:
        """Whether slot 0 is a scratch slot padded rows write (exempt from the KV check)."""
        return self.padded_slot == SCRATCH_SLOT

    def unscheduled(self, case) -> Optional[str]:
        """Why the engine never hands the steps of `case`, or None: decode rows verifying drafts beside
        prefill rows where it schedules none, drafts its rule refuses."""
        from kit.engine.modes import rules_for  # torch: only when a case is judged

        rules = rules_for(case.mode)
        decode_tokens = rules.decode_tokens(case)
        if decode_tokens > 1 and not self.spec_rows_beside_prefill:
            return (f"engine {self.name!r} schedules no decode rows of {decode_tokens} tokens (verifying drafts) "
                    f"beside prefill rows (its profile's spec_rows_beside_prefill)")
        return self.draft_problem(case)

    def draft_problem(self, case) -> Optional[str]:
        """Why its draft rule refuses a speculative case's drafts, or None (also where the case's
        mode has none, and for a case with no draft shape of its own: a recurrent case verifies a
        chain of its `new` drafts, kit.engine.kinds.recurrent, which every rule takes)."""
        from kit.engine.modes import rules_for  # torch: only when a case is judged

        if self.drafts is None or not hasattr(case, "topk") or not rules_for(case.mode).speculative:
            return None
        return self.drafts(case)

    def problem(self) -> Optional[str]:
        """What is malformed in the profile, or None."""
        from kit.engine.storage import STORAGES  # torch: only when a backend is loaded

        bad = [s for s in self.storage.values() if s not in STORAGES]
        if bad:
            return f"unknown KV storage {bad[0]!r} (known: {', '.join(STORAGES)})"
        if self.batch not in (FORWARD_BATCH, COMMON, STEP):
            return f"batch must be {FORWARD_BATCH!r}, {COMMON!r} or {STEP!r}, not {self.batch!r}"
        if self.hooks == BUILDER and self.batch != COMMON:
            return f"builder hooks read batch.common: set batch={COMMON!r}"
        if self.padded_slot not in (SCRATCH_SLOT, NO_WRITE):
            return f"padded_slot must be {SCRATCH_SLOT} (scratch) or {NO_WRITE} (no write), not {self.padded_slot!r}"
        if self.padded_query_len not in (None, 0):
            return f"padded_query_len must be None (a real row's) or 0 (an empty request), not {self.padded_query_len!r}"
        if self.hooks not in (None, TWO_PHASE, CAPTURE_REPLAY, BUILDER):
            return f"hooks must be None, {TWO_PHASE!r}, {CAPTURE_REPLAY!r} or {BUILDER!r}, not {self.hooks!r}"
        if self.drafts is not None and not callable(self.drafts):
            return f"drafts must be None or a function of a case (kit.engine.drafts), not {self.drafts!r}"
        if self.row_order not in ROW_ORDERS:
            return f"row_order must be one of {', '.join(map(repr, ROW_ORDERS))}, not {self.row_order!r}"
        if self.recurrent_verify not in (INTERMEDIATE_POOLS, PER_TOKEN_BLOCKS):
            return f"recurrent_verify must be {INTERMEDIATE_POOLS!r} or {PER_TOKEN_BLOCKS!r}, not {self.recurrent_verify!r}"
        for name, sizes in (("batch_sizes", self.batch_sizes), ("token_buckets", self.token_buckets)):
            if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                return f"{name} must be increasing sizes >= 1, not {sizes!r}"
        return None


SGLANG = EngineProfile("sglang", storage={"dense": "split", "mla": "latent", "sparse_mla": "latent"},
                       drafts=drafts.sglang)
# A backend written against the kit's own step description (`batch.step`), over SGLang's pools and drafts.
NATIVE = EngineProfile("native", storage=SGLANG.storage, batch=STEP, drafts=drafts.sglang)
