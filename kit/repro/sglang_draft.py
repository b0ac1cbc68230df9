"""The SGLang part of a standalone file for a multi-step draft decode (TritonMultiStepDraftBackend,
FlashInferMultiStepDraftBackend): the draft's steps as SGLang's EAGLE worker runs them, eager. The
wrapper's init_forward_metadata builds every step's metadata once, on the batch prepare_for_draft
makes (the committed lengths, every lane's columns as write slots, one position a lane); then step
i's forward runs each layer under the wrapper's i-th backend, on column i of every lane's slots at
positions seq_len + i (eagle_worker_v2.py draft_forward). The kit's own DRAFT_DECODE rules:
kit.engine.modes.draft_decode."""
from __future__ import annotations

HOW = ("Builds the batches with SGLang's own classes (ReqToTokenPool, MHATokenToKVPool, KVIndexTranslator,\n"
       "the multi-step draft backend, RadixAttention, ForwardBatch) and calls them in the order its EAGLE draft\n"
       "worker does (init_forward_metadata once for every step, then per step each layer's forward under that\n"
       "step's backend, on the step's write slots and positions; each step reads the KV the earlier ones wrote).")

# Graphs: the draft's graph runner (eagle_draft_cuda_graph_runner.py) captures all steps in one graph over its
# own static buffers, which the file's decode graph part (SGLang's CudaGraphRunner) does not build.
GRAPH_REFUSED = ("graph runs of SGLang's multi-step draft backends: standalone files reproduce their eager "
                 "steps only (the draft's graph runner captures every step in one graph); give the eager run's id")

STEPS = '''

def draft_fields(reqs):
    """The batch the draft's metadata is built on, as prepare_for_draft makes it: seq_lens the committed lengths,
    every lane's columns as write slots in (request, lane, column) order, one position (seq_len) a lane."""
    fields = batch_fields("decode", reqs)
    fields.update(positions=device_ints([r["seq_len"] for r in reqs for _ in range(SPEC["topk"])], torch.int64),
                  spec_info=EagleDraftInput())
    return fields


def step_fields(fields, step):
    """Step `step`'s batch, as draft_forward makes it: column `step` of every lane's slots, positions + step."""
    loc = fields["out_cache_loc"].view(fields["batch_size"], SPEC["topk"], SPEC["num_steps"])[:, :, step]
    return dict(fields, out_cache_loc=loc.reshape(-1), positions=fields["positions"] + step,
                spec_info=EagleDraftInput())


def run(batch, inputs):
    """The draft's steps: the wrapper's init_forward_metadata once, then per step each layer's forward under
    the step's backend. Returns per layer every step's outputs, step after step."""
    reqs = batch["requests"]
    load(reqs, inputs)
    fields = draft_fields(reqs)
    backend.init_forward_metadata(forward_batch(fields))
    outs = []
    for step, (step_reqs, per_layer) in enumerate(forwards(batch, inputs)):
        qkv = [[new_tokens(step_reqs, per_req, which) for which in range(3)] for per_req in per_layer]
        outs.append(handed(lambda: forward(step_fields(fields, step), qkv, backend.attn_backends[step]), qkv))
    return [torch.cat(per_step) for per_step in zip(*outs)]
'''


def part(backend_cls, exec_: str) -> str:
    """The draft's `run` for a run of `backend_cls` in `exec_`."""
    from kit.repro.scenario import NotReproducible

    if not backend_cls.draft_worker:  # a one-step backend: SGLang runs the draft's steps in a multi-step wrapper
        raise NotReproducible(backend_cls.draft_decode_reason)
    if exec_ != "eager":
        raise NotReproducible(GRAPH_REFUSED)
    return STEPS
