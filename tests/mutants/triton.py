"""Mutants of the Triton backend: each is one real bug class of attention backends,
made by overriding one method of TritonBackend (its source stays untouched).
The docstring of each class names the bug; the catalog in __init__ says which
failure class the kit must report."""
from __future__ import annotations

import dataclasses

import torch

from backends.triton import TritonBackend
from backends.triton.backend import EXTEND_LIKE
from backends.triton.metadata import MAX_KV_SPLITS, block_capacity, cdiv, fill_draft_step, fill_kv, fill_splits
from kit.modes import ForwardMode


class BsFromBufferLength(TritonBackend):
    """The replay hook takes the batch size from the length of the req_pool_indices it is
    handed (SGLang PR 26134's review): right for exact-size views, wrong for the
    full-capacity buffers SGLang's draft-extend runner passes."""

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        if not in_capture and self.graph_bufs is not None:
            batch = dataclasses.replace(batch, batch_size=len(batch.req_pool_indices))
        super().init_forward_metadata_out_graph(batch, in_capture)


class ExtendGridFromRequestCount(TritonBackend):
    """The extend grid sized for the batch's own request count: a token-bucket graph
    captured with few requests leaves rows unwritten when replayed with many, and
    one captured with many reads a stale block table when replayed with few."""

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        super().init_forward_metadata_out_graph(batch, in_capture)
        md = self.forward_metadata
        if batch.forward_mode is not ForwardMode.DECODE:
            md.num_blocks = block_capacity(self._extend_tokens(batch), batch.batch_size + 1)
            if batch.forward_mode is ForwardMode.EXTEND:
                self._fill_extend(batch)


class MetadataCachedByShape(TritonBackend):
    """Eager metadata cached by batch shape (mode, batch size, tokens) and reused for the
    next batch of that shape: its kv indices are another batch's."""

    def init_forward_metadata(self, batch):
        key = (batch.forward_mode, batch.batch_size, batch.num_tokens)
        cache = self.__dict__.setdefault("by_shape", {})
        if key in cache:
            self.forward_metadata = cache[key]
            return
        super().init_forward_metadata(batch)
        cache[key] = self.forward_metadata


class DraftExtendCountsDraftsTwice(TritonBackend):
    """DRAFT_EXTEND_V2 takes seq_lens as the prefix, though seq_lens already count
    the drafts: the drafts are attended twice (once from the pool)."""

    def _extend_inputs(self, batch):
        prefix, q_lens, mask = super()._extend_inputs(batch)
        if batch.forward_mode is ForwardMode.DRAFT_EXTEND_V2:
            prefix = batch.seq_lens[:batch.batch_size]
        return prefix, q_lens, mask


class DraftExtendNoClamp(TritonBackend):
    """DRAFT_EXTEND_V2 prefix = seq_lens - extend lens without the clamp at 0: padded
    graph rows (seq_len = fill value) get a negative KV length."""

    def _extend_inputs(self, batch):
        prefix, q_lens, mask = super()._extend_inputs(batch)
        if batch.forward_mode is ForwardMode.DRAFT_EXTEND_V2:
            prefix = batch.seq_lens[:batch.batch_size] - q_lens
        return prefix, q_lens, mask


class ReplayRebindsIndptr(TritonBackend):
    """Replay builds kv_indptr and the custom-mask buffer as new tensors instead of filling
    the captured ones in place: the graph keeps reading the old ones (wrong wherever the
    replay hook itself fills them: EXTEND's metadata, TARGET_VERIFY's mask)."""

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        if not in_capture and self.graph_bufs is not None:
            self.graph_bufs.kv_indptr = torch.zeros_like(self.graph_bufs.kv_indptr)
            self.graph_bufs.mask = torch.zeros_like(self.graph_bufs.mask)
        super().init_forward_metadata_out_graph(batch, in_capture)


class SplitsFromCaptureHostValue(TritonBackend):
    """The decode grid's split count is computed on the host from the batch's longest
    sequence, once at capture, and silently reused at replay while num_kv_splits
    (on the device) follows the new batch: splits past the captured grid never run."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.host_splits = {}

    def _max_splits(self, batch):
        bs = batch.batch_size
        if self.graph_bufs is None or bs not in self.host_splits:  # eager, or the capture of bs
            longest = int(batch.seq_lens[:bs].max())
            self.host_splits[bs] = min(super()._max_splits(batch), cdiv(longest, self.split_tokens))
        return self.host_splits[bs]


class SplitsBakedAndMirrorUndeclared(SplitsFromCaptureHostValue):
    """SplitsFromCaptureHostValue whose eager batches take the longest sequence from seq_lens_cpu, a
    host mirror it declares it does not read: handed None, eager sizing raises, so the mirror is to
    blame too; the replay is still wrong where eager with exact mirrors is right (a graph bug)."""

    host_mirrors = ()

    def _max_splits(self, batch):
        if self.graph_bufs is None:
            return min(MAX_KV_SPLITS, cdiv(int(batch.seq_lens_cpu[:batch.batch_size].max()), self.split_tokens))
        return super()._max_splits(batch)


class PaddedRowsWriteRealSlot(TritonBackend):
    """KV of padded rows (out_cache_loc 0, the scratch slot) is redirected to the first
    real slot, as a backend that treats slot 0 as 'unset' would."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if save_kv_cache:
            loc = batch.out_cache_loc
            real = torch.where(loc == 0, batch.token_to_kv_pool.page_size, loc)
            batch.token_to_kv_pool.set_kv_buffer(layer, real, k, v)
        return super().forward(q, k, v, layer, batch, save_kv_cache=False)


class _LayerMutant(TritonBackend):
    """Base: forward() runs with a changed copy of the layer."""

    def mutate(self, layer, batch):
        return layer

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        return super().forward(q, k, v, self.mutate(layer, batch), batch, save_kv_cache)


class FirstLayerConfigForAll(_LayerMutant):
    """The first layer's window, scale and cap, kept from the step's first forward, are used
    for every layer (a config cached per step, not per layer): wrong on hybrid models."""

    def mutate(self, layer, batch):
        first = self.__dict__.setdefault("first_layer", layer)
        return dataclasses.replace(layer, scaling=first.scaling, logit_cap=first.logit_cap,
                                   sliding_window_size=first.sliding_window_size)


class WindowOneShort(_LayerMutant):
    """Sliding window of W keys instead of W + 1 (the query's own position forgotten)."""

    def mutate(self, layer, batch):
        w = layer.sliding_window_size
        return dataclasses.replace(layer, sliding_window_size=w - 1) if w > 0 else layer


class WindowOneLong(_LayerMutant):
    """Sliding window of W + 2 keys (the window bound taken as exclusive)."""

    def mutate(self, layer, batch):
        w = layer.sliding_window_size
        return dataclasses.replace(layer, sliding_window_size=w + 1) if w >= 0 else layer


class LogitCapIgnoredInVerify(_LayerMutant):
    """The logit cap is dropped in TARGET_VERIFY (other modes keep it)."""

    def mutate(self, layer, batch):
        if batch.forward_mode is ForwardMode.TARGET_VERIFY:
            return dataclasses.replace(layer, logit_cap=0.0)
        return layer


class VerifyIgnoresTreeMask(TritonBackend):
    """TARGET_VERIFY attends plain causal and ignores the custom mask: right for chains,
    wrong for trees."""

    def _extend_inputs(self, batch):
        prefix, q_lens, _ = super()._extend_inputs(batch)
        return prefix, q_lens, None


class DecodeReadsOnePast(TritonBackend):
    """Decode attends seq_len + 1 keys: one past the end of the request."""

    def _fill_decode(self, bufs, req_pool_indices, seq_lens):
        super()._fill_decode(bufs, req_pool_indices, seq_lens + 1)


class DecodeReadsOneShort(TritonBackend):
    """Decode attends seq_len - 1 keys: the new token is missed."""

    def _fill_decode(self, bufs, req_pool_indices, seq_lens):
        super()._fill_decode(bufs, req_pool_indices, seq_lens - 1)


class PrefixReadsOneShort(TritonBackend):
    """EXTEND, TARGET_VERIFY and DRAFT_EXTEND_V2 read one cached key fewer than the prefix
    holds (an off-by-one in the prefix length): the last cached token is missed."""

    def _extend_inputs(self, batch):
        prefix, q_lens, mask = super()._extend_inputs(batch)
        return torch.clamp(prefix - 1, min=0), q_lens, mask


class KvIndicesFromStaleSum(TritonBackend):
    """Eager kv_indices sized from seq_lens_sum, a host mirror the engine does not wait to make exact
    (sgl-project/sglang#26665): handed one step stale (the sum before the step's tokens), the index
    builder writes past its end."""

    host_mirrors = ("seq_lens_sum",)

    def _key_capacity(self, batch):
        return batch.seq_lens_sum


class SeqLensSumReadUndeclared(KvIndicesFromStaleSum):
    """Reads seq_lens_sum as KvIndicesFromStaleSum does, but declares it reads no host mirror: an engine
    that does not wait for the device hands None (SGLang's gpu-only path), and sizing from it raises."""

    host_mirrors = ()


class ExtendPaddingNotRouted(TritonBackend):
    """EXTEND graph mode: the padded tokens are not routed to a dummy request, so the
    kernel's query rows (the padded token count) and qo_indptr disagree."""

    def _extend_tokens(self, batch):
        if batch.forward_mode is ForwardMode.EXTEND:
            return int(batch.extend_seq_lens[:batch.batch_size].sum())  # the real tokens only
        return super()._extend_tokens(batch)


class _PositionsMutant(TritonBackend):
    """Base: forward() runs with other query positions (the kernels read them for the window)."""

    def positions(self, batch):
        return batch.positions

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        return super().forward(q, k, v, layer, dataclasses.replace(batch, positions=self.positions(batch)),
                               save_kv_cache)


def _from_seq_lens(batch):
    """seq_len + token index, for every request's fixed count of new tokens."""
    per_req = batch.spec_info.draft_token_num
    index = torch.arange(per_req, device=batch.seq_lens.device).repeat(batch.batch_size)
    return batch.seq_lens.long().repeat_interleave(per_req) + index


class VerifyWindowByIndex(_PositionsMutant):
    """TARGET_VERIFY applies the sliding window on the token index (seq_len + draft index)
    instead of the position (seq_len + tree depth), as a kernel that infers positions
    from kv_len - qo_len does: right for chains, wrong for trees."""

    def positions(self, batch):
        return _from_seq_lens(batch) if batch.forward_mode is ForwardMode.TARGET_VERIFY else batch.positions


class DraftExtendPositionsFromSeqLens(_PositionsMutant):
    """DRAFT_EXTEND_V2 positions taken as seq_len + draft index, the TARGET_VERIFY convention,
    though its seq_lens already count the drafts: every window sits num_draft_tokens late."""

    def positions(self, batch):
        return _from_seq_lens(batch) if batch.forward_mode is ForwardMode.DRAFT_EXTEND_V2 else batch.positions


class OutputInFp32(TritonBackend):
    """The output comes back in fp32, the kernels' accumulator dtype, instead of q's dtype
    (an output buffer allocated as float32): right values, a wrong tensor for o_proj."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return out.float(), lse


class OutputOnHost(TritonBackend):
    """The output comes back on the host (a CPU fallback path): right values, wrong device."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return out.cpu(), lse


def read_dense(x: torch.Tensor) -> torch.Tensor:
    """x's storage read with the dense strides of x's shape, from where x starts: what a kernel
    handed a contiguous tensor's strides (or a `.view` of the storage) reads of a strided view."""
    strides, step = [], 1
    for size in reversed(x.shape):
        strides.insert(0, step)
        step *= size
    return x.as_strided(x.shape, strides)


class StridesIgnored(TritonBackend):
    """The attention kernels read q, k and v with the dense strides of their shape: right for
    tensors of their own, wrong for the views of one fused QKV row models pass (another
    head's, another token's values). The KV write reads them right."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if save_kv_cache:
            batch.token_to_kv_pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        return super().forward(read_dense(q), read_dense(k), read_dense(v), layer, batch, save_kv_cache=False)


class QScaledInPlace(TritonBackend):
    """forward() folds the softmax scale into q in place (q *= sm_scale, then the kernels at
    scale 1): the output is right, but the caller's q, the model's QKV row, is changed, as
    SGLang's KV pool divides the caller's K/V by the scale in place on its fp8 path."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        q.mul_(layer.scaling)
        return super().forward(q, k, v, dataclasses.replace(layer, scaling=1.0), batch, save_kv_cache)


# ---- the multi-step draft decode and MIXED batches

class DraftGraphKeysWithoutTopk(TritonBackend):
    """A draft decode graph's kv_indices sized for the largest batch's requests, not its lanes: the
    topk factor missing (sgl-project/sglang#27338, #27460). A full bucket of K lanes over long rows
    writes past it."""

    def _draft_graph_keys(self):
        return self.graph_rows // self.ctx.speculative.topk * self.ctx.max_context_len


class DraftGraphKeysFromContextLength(TritonBackend):
    """A draft decode graph's kv_indices sized by the model's context length instead of the request
    pool's rows (sgl-project/sglang#29695): rows within `steps` of the context length read their
    lanes past it, and a full bucket of them writes past the buffer."""

    def _draft_graph_keys(self):
        return self.graph_rows * self.ctx.context_len


class DraftStepLengthsNotRefreshed(TritonBackend):
    """Every draft step's key counts (and with them its split plan) from step 0's, as a backend
    that plans the draft once and shares the plan across steps (SGLang shares one split count, right
    only because its kernel takes each row's length from kv_indptr): from step 2 on, a lane misses
    its newest tokens, the query's own among them."""

    def _fill_draft(self, batch):
        bs, spec = batch.batch_size, batch.spec_info
        for md in self.draft_metadata:
            fill_draft_step(md.bufs, self.req_to_token, batch.req_pool_indices[:bs], batch.seq_lens[:bs], spec.topk,
                            spec.num_steps, 0, self.split_tokens)


class DraftLanesReadLaneZero(TritonBackend):
    """Every draft lane reads lane 0's columns (a layout that forgets the lane's offset, k * steps):
    right for a chain, wrong for a tree's other lanes, which attend another lane's tokens."""

    def _fill_draft(self, batch):
        bs, spec = batch.batch_size, batch.spec_info
        for step, md in enumerate(self.draft_metadata):
            fill_kv(md.bufs, self.req_to_token, batch.req_pool_indices[:bs], batch.seq_lens[:bs], spec.topk, 0,
                    step + 1)
            fill_splits(md.bufs, bs * spec.topk, self.split_tokens)


class DraftExtendRowsFromSteps(TritonBackend):
    """DRAFT_EXTEND_V2's graph metadata takes each request's query rows as the draft's steps + 1, not
    the draft token count the runner lays out (sgl-project/sglang#27545): the same for a chain, a
    wrong stride for a tree of another draft count, whose requests past the first read the wrong
    rows (eager, which takes the batch's own lengths, is right)."""

    def _extend_inputs(self, batch):
        prefix, q_lens, mask = super()._extend_inputs(batch)
        if batch.forward_mode is ForwardMode.DRAFT_EXTEND_V2 and self.graph_bufs is not None:
            q_lens = torch.full_like(q_lens, batch.spec_info.num_steps + 1)
        return prefix, q_lens, mask


class MixedPrefixesPageAligned(TritonBackend):
    """Every extend row's cached prefix taken as page-aligned (rounded down to the page), as SGLang's
    radix cache hands an EXTEND batch's prefixes: a MIXED batch's decode rows (prefix = seq_len - 1)
    are not, and lose the keys of their last partial page (SGLang PR 38180's class)."""

    def _extend_inputs(self, batch):
        prefix, q_lens, mask = super()._extend_inputs(batch)
        if batch.forward_mode in EXTEND_LIKE:
            prefix = prefix - prefix % self.ctx.page_size
        return prefix, q_lens, mask


class MixedPrefixesUncounted(TritonBackend):
    """A MIXED batch planned as a batch of fresh prompts: every row an extend with no cached prefix,
    so a decode row attends only its own new token."""

    def _extend_inputs(self, batch):
        prefix, q_lens, mask = super()._extend_inputs(batch)
        if batch.forward_mode is ForwardMode.MIXED:
            prefix = torch.zeros_like(prefix)
        return prefix, q_lens, mask


# Batch invariance (the backend declares batch_invariant): a request's KV splits follow its own length
# alone. Each mutant chooses them from the batch instead; every output stays within tolerance, only its
# last bits move, so only the comparison of a recurring request across batches sees it.
NOMINAL_SMS = 16  # the interpreter has no SMs


class SplitsByBatchSize(TritonBackend):
    """The decode split count capped by the batch size, as split-KV heuristics choose it (splits only
    while the batch leaves the GPU idle, about two programs per SM): in a batch of another size (or
    another graph bucket) a request's partial outputs are merged from other splits."""

    def _max_splits(self, batch):
        sms = (torch.cuda.get_device_properties(self.ctx.device).multi_processor_count
               if self.ctx.device.type == "cuda" else NOMINAL_SMS)
        return max(1, min(MAX_KV_SPLITS, cdiv(2 * sms, batch.batch_size * self.num_kv_heads)))

    def _fill_decode(self, bufs, req_pool_indices, seq_lens):
        super()._fill_decode(bufs, req_pool_indices, seq_lens)
        bufs.num_kv_splits[:seq_lens.shape[0]].clamp_(max=self.forward_metadata.max_splits)


class SplitsFromLongestRequest(TritonBackend):
    """One decode split count for the whole batch, from its longest request (one num_splits per
    launch): beside a longer request, a request's keys are split, and merged, otherwise."""

    def _fill_decode(self, bufs, req_pool_indices, seq_lens):
        super()._fill_decode(bufs, req_pool_indices, seq_lens)
        longest = torch.clamp((seq_lens.max() + self.split_tokens - 1) // self.split_tokens, 1, MAX_KV_SPLITS)
        bufs.num_kv_splits[:seq_lens.shape[0]].copy_(longest.expand(seq_lens.shape[0]))
