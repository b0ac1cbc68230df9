"""How a backend's metadata hooks are driven, in its engine's style (kit.engine.profile): for an
eager step, before a graph's capture, before each replay (outside the graph) and inside the
graph. One driver per style, chosen once per run from the backend's capabilities:

- two-phase (SGLang 0.5.23): init_forward_metadata_out_graph(batch, in_capture) outside the
  graph, init_forward_metadata_in_graph(batch) recorded in it;
- capture/replay (SGLang's older pair): init_forward_metadata_capture_cuda_graph(bs, num_tokens,
  req_pool_indices, seq_lens, forward_mode, spec_info), then before each replay
  init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, seq_lens_sum,
  forward_mode, spec_info, seq_lens_cpu);
- builder (vLLM's metadata builders): the step in engine-neutral terms (kit.engine.common.CommonBatch,
  `batch.common`, rendered from the step description; an eager batch has it as rendered), held
  in the graph's static buffers, then build_for_capture(batch) at capture (anew before each
  warm-up run and the captured run, as vLLM's runner builds it) and
  init_forward_metadata(batch) before each replay. A capture describes the engine's capture batch
  (kit.engine.common.capture_batch: requests of the graph's shape with the worst replay's host
  maxima), a replay the step description of the batch, its padded rows as the profile pads them.

Ragged (token-bucket) graphs run the backend's eager metadata before capture and replay, as
SGLang's piecewise prefill graphs do; a two-phase backend its out_graph hook.
"""
from __future__ import annotations

import dataclasses

import torch

from kit.engine.common import capture_batch, render
from kit.engine.modes import rules_for
from kit.engine.profile import BUILDER, CAPTURE_REPLAY, TWO_PHASE


class HookDriver:
    style = ""

    def __init__(self, backend, caps):
        self.backend, self.caps = backend, caps

    def eager(self, batch):
        """Before an eager step; returns the batch forward() gets."""
        self.backend.init_forward_metadata(batch)
        return batch

    def capture(self, view, num_tokens: int):
        """Before a capture of a batch-size graph, outside it; returns the batch the graph records."""
        raise NotImplementedError

    def replay(self, view, plan, num_tokens: int):
        """Before each replay of a batch-size graph, outside it; returns the batch the hooks got.
        `plan` describes the view's real requests (kit.engine.plan), its first rows; the rest are padded."""
        raise NotImplementedError

    def ragged(self, view, plan, in_capture: bool = False):
        """Before a capture or replay of a token-bucket graph, outside it."""
        self.backend.init_forward_metadata(view)
        return view

    def in_graph(self, view) -> None:
        """Recorded in the graph, before the forwards."""

    def before_capture_run(self, view) -> None:
        """Before each warm-up run of a capture and before the captured run, outside the graph, after
        the capture hook: SGLang's graph runner runs its capture hook once for them all."""

    def prepare(self, max_bs: int, req_to_token, page: int, device, padded_seq_len: int) -> None:
        """Once a run, before its first capture: the driver's own buffers, for the largest batch;
        `padded_seq_len`: a padded request's seq_lens entry."""


class TwoPhase(HookDriver):
    style = TWO_PHASE

    def capture(self, view, num_tokens):
        self.backend.init_forward_metadata_out_graph(view, in_capture=True)
        return view

    def replay(self, view, plan, num_tokens):
        self.backend.init_forward_metadata_out_graph(view)
        return view

    def ragged(self, view, plan, in_capture=False):
        self.backend.init_forward_metadata_out_graph(view, in_capture=in_capture)
        return view

    def in_graph(self, view):
        if self.caps.in_graph:
            self.backend.init_forward_metadata_in_graph(view)


class CaptureReplay(HookDriver):
    style = CAPTURE_REPLAY

    def capture(self, view, num_tokens):
        self.backend.init_forward_metadata_capture_cuda_graph(
            view.batch_size, num_tokens, view.req_pool_indices, view.seq_lens, view.forward_mode, view.spec_info)
        return view

    def replay(self, view, plan, num_tokens):
        self.backend.init_forward_metadata_replay_cuda_graph(
            view.batch_size, view.req_pool_indices, view.seq_lens, view.seq_lens_sum, view.forward_mode,
            view.spec_info, view.seq_lens_cpu)
        return view


class Builder(HookDriver):
    """The step described as `batch.common`, its request tensors copied into buffers of the
    driver's own that keep their addresses from capture to replay (as an engine's runner keeps
    its persistent inputs), sized once for the graph's largest batch (prepare)."""

    style = BUILDER

    def __init__(self, backend, caps):
        super().__init__(backend, caps)
        self.static = None  # {field: buffer} of the CommonBatch tensors a captured graph reads
        self.padded_seq_len = 0

    def prepare(self, max_bs: int, req_to_token, page: int, device, padded_seq_len: int) -> None:
        self.padded_seq_len = padded_seq_len
        blocks = -(-req_to_token.shape[1] // page)
        self.static = dict(query_start_loc=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
                           seq_lens=torch.zeros(max_bs, dtype=torch.int32, device=device),
                           block_table=torch.zeros((max_bs, blocks), dtype=torch.int32, device=device))

    def _held(self, view, common):
        """`view` carrying `common`, its request tensors copied into the driver's buffers."""
        held = {}
        for field, buffer in self.static.items():
            new = getattr(common, field)
            head = buffer[:new.shape[0]]
            head.copy_(new)
            held[field] = head
        return dataclasses.replace(view, common=dataclasses.replace(common, **held))

    def _described(self, view, plan):
        """`view` carrying `plan` rendered over its rows, its padded ones as the profile pads them:
        empty, or read as the mode's real ones (of the padded seq_lens entry)."""
        padded = (0, 0)
        if self.caps.profile.padded_query_len is None:
            padded = rules_for(plan.case.mode).padded_lens(plan.case, self.padded_seq_len)
        common = render(plan, view.out_cache_loc, view.req_to_token_pool.req_to_token, view.token_to_kv_pool.page_size,
                        rows=view.batch_size, padded=padded)
        return self._held(view, common)

    def _captured(self, view, max_query_len: int):
        """The engine's capture batch over the view's shape; its longest context the pool's."""
        max_seq_len = view.req_to_token_pool.max_context_len
        view = self._held(view, capture_batch(view, max_query_len, max_seq_len))
        self.backend.build_for_capture(view)
        return view

    def capture(self, view, num_tokens):
        return self._captured(view, max_query_len=num_tokens // view.batch_size)

    def before_capture_run(self, view):
        """vLLM's runner builds the metadata anew for each warm-up run and for the capture (a _dummy_run
        each, v1/worker/gpu_model_runner.py), so what a builder's metadata plans at its first forward
        (FlashMLA's FlashMLASchedMeta, planned in flash_mla_with_kvcache) is planned in the graph too."""
        self.backend.build_for_capture(view)

    def replay(self, view, plan, num_tokens):
        view = self._described(view, plan)
        self.backend.init_forward_metadata(view)
        return view

    def ragged(self, view, plan, in_capture=False):
        if in_capture:  # one request may hold every token of the bucket at a replay
            return self._captured(view, max_query_len=view.out_cache_loc.shape[0])
        return self.replay(view, plan, view.out_cache_loc.shape[0])


DRIVERS = {TWO_PHASE: TwoPhase, CAPTURE_REPLAY: CaptureReplay, BUILDER: Builder}


def driver_for(backend, caps) -> HookDriver:
    """The driver of the backend's hook style (its eager metadata alone where it has no graph hooks)."""
    return DRIVERS.get(caps.hook_style, HookDriver)(backend, caps)
