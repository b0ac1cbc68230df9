"""Mutants of the FlashInfer adapter (backends/flashinfer.py), made the same way:
one overridden method, the adapter's source untouched."""
from __future__ import annotations

from backends.flashinfer import FlashInferBackend
from kit.modes import ForwardMode


class DraftExtendNoClamp(FlashInferBackend):
    """DRAFT_EXTEND_V2 prefix = seq_lens - extend lens without the clamp at 0: a padded
    graph row (seq_len = fill value 1, drafts = 3+) plans a KV length shorter than
    its query rows."""

    @staticmethod
    def _lengths(mode, seq_lens, spec_info, extend_lens):
        q, kv = FlashInferBackend._lengths(mode, seq_lens, spec_info, extend_lens)
        if mode is ForwardMode.DRAFT_EXTEND_V2:
            kv = (seq_lens.to(q.dtype) - q) + q
        return q, kv


class ReplayBsFromBuffer(FlashInferBackend):
    """Replay takes the batch size from a buffer's length (the req_pool_indices view
    the last capture was given) instead of its `bs` argument: it re-plans another
    bucket's wrapper, and the graph of this bucket keeps stale metadata."""

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, *args):
        self.captured_rpi = req_pool_indices
        super().init_forward_metadata_capture_cuda_graph(bs, num_tokens, req_pool_indices, *args)

    def init_forward_metadata_replay_cuda_graph(self, bs, *args):
        super().init_forward_metadata_replay_cuda_graph(len(self.captured_rpi), *args)
