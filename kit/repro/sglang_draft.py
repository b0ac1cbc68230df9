"""What a standalone file says of a multi-step draft decode (TritonMultiStepDraftBackend,
FlashInferMultiStepDraftBackend), and which backends it runs on. The file's SGLang part
(kit.repro.sglang_file) runs the draft's steps as SGLang's EAGLE worker does: the wrapper's metadata
built once for every step, on the batch prepare_for_draft makes (the committed lengths, every lane's
columns as write slots, one position a lane); then step i's forward runs each layer under the
wrapper's i-th backend, on column i of every lane's slots at positions seq_len + i (eagle_worker_v2.py
draft_forward); a graph run records every step in one graph, as the draft's graph runner does
(eagle_draft_cuda_graph_runner.py). The kit's own DRAFT_DECODE rules: kit.engine.modes.draft_decode."""
from __future__ import annotations

_POOLS = ("Builds the batches with SGLang's own classes (ReqToTokenPool, MHATokenToKVPool, KVIndexTranslator,\n"
          "the multi-step draft backend, RadixAttention, ForwardBatch) and calls them in the order its EAGLE draft\n")
HOW = {"eager": _POOLS + (
    "worker does (init_forward_metadata once for every step, then per step each layer's forward under that\n"
    "step's backend, on the step's write slots and positions; each step reads the KV the earlier ones wrote)."),
       "graph": _POOLS + (
    "graph runner does (init_cuda_graph_state(max_bs, max_bs * topk); per bucket, largest first,\n"
    "init_forward_metadata_out_graph(in_capture=True) and the capture of every step's forwards on padded rows;\n"
    "per replay the static buffers refilled, init_forward_metadata_out_graph, the replay).")}


def how(backend_cls, exec_: str) -> str:
    """What the file of a draft decode run of `backend_cls` in `exec_` says it does; a one-step backend has none."""
    from kit.repro.scenario import NotReproducible

    if not backend_cls.draft_worker:  # a one-step backend: SGLang runs the draft's steps in a multi-step wrapper
        raise NotReproducible(backend_cls.draft_decode_reason)
    return HOW[exec_]
