"""Real-code mutants: known SGLang bugs replayed on SGLang's own source. Each is a
one-line patch of a copy of an sglang module (tests.mutants.patching), whose class
the adapter then wraps. Line numbers are sglang 0.5.23's (the adapter's pin); a
patch whose line no longer reads as expected raises, naming it."""
from __future__ import annotations

import types

from backends.sglang.adapter import SGLangFlashInferMLABackend, SGLangTritonBackend, SGLangTritonDraftBackend
from tests.mutants import patching

TRITON = "sglang.srt.layers.attention.triton_backend"
FLASHINFER_MLA = "sglang.srt.layers.attention.flashinfer_mla_backend"
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"


def patched_module(module: str, line: int, old: str, new: str) -> types.ModuleType:
    """tests.mutants.patching's, after sglang's set-up (shims, interpreter)."""
    import backends.sglang.runtime  # noqa: F401

    return patching.patched_module(module, line, old, new)


def patched_method(module: str, cls: str, method: str, line: int, old: str, new: str) -> type:
    import backends.sglang.runtime  # noqa: F401

    return patching.patched_method(module, cls, method, line, old, new)


class _TritonMutant(SGLangTritonBackend):
    """TritonAttnBackend from a copy of triton_backend.py with the line `patch` = (line, old, new)."""

    patch = (0, "", "")

    def _impl_class(self):
        return patched_module(TRITON, *self.patch).TritonAttnBackend


class ReplayBsFromBuffer(_TritonMutant):
    """The replay hook takes bs from the length of the req_pool_indices it is handed
    (SGLang PR 26134's review): right for the decode runner's views sliced to bs, wrong
    for the full-capacity buffers the draft-extend runner hands over."""

    patch = (759, "bs = forward_batch.batch_size", "bs = len(forward_batch.req_pool_indices)")


class DraftExtendCountsDraftsTwice(_TritonMutant):
    """The DRAFT_EXTEND_V2 graph metadata takes seq_lens as the prefix, though seq_lens
    already count the drafts (SGLang PR 26651): the drafts are attended twice, once
    from the pool."""

    patch = (725, "kv_lens = torch.clamp(seq_lens - extend_seq_lens, min=0).to(torch.int32)",
             "kv_lens = torch.clamp(seq_lens, min=0).to(torch.int32)")


class VerifyMaskNotRefreshed(_TritonMutant):
    """The TARGET_VERIFY custom mask is copied into the graph's mask buffer at the first
    capture only, not before every replay: replays attend with the capture's all-ones mask."""

    patch = (637, "if spec_info is not None and spec_info.custom_mask is not None:",
             "if spec_info is not None and spec_info.custom_mask is not None and self.forward_metadata is None:")


class ReplayWritesFreshKvIndptr(_TritonMutant):
    """kv_indptr is written into a fresh tensor instead of the backend's buffer: right
    eagerly (the fresh tensor is used), while a graph keeps reading the buffer it
    captured, never filled."""

    patch = (525, "kv_indptr = self.kv_indptr[: bs + 1]",
             "kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)")


class DraftExtendNoClamp(_TritonMutant):
    """The DRAFT_EXTEND_V2 graph prefix seq_lens - drafts without the clamp at 0: a padded
    row (seq_len = fill value 1) gets a negative KV length."""

    patch = (725, "kv_lens = torch.clamp(seq_lens - extend_seq_lens, min=0).to(torch.int32)",
             "kv_lens = (seq_lens - extend_seq_lens).to(torch.int32)")


class DraftExtendRowsFromSteps(_TritonMutant):
    """DRAFT_EXTEND_V2's graph metadata takes each request's query rows as speculative_num_steps + 1,
    not the num_draft_tokens the runner lays out (sgl-project/sglang#27545, the line it fixed): the
    same for a chain, for a tree of another draft count a wrong qo_indptr stride, NaN at bs > 1."""

    patch = (703, "self.num_draft_tokens", "self.speculative_num_steps + 1")


class DraftGraphKeysWithoutTopk(SGLangTritonDraftBackend):
    """TritonMultiStepDraftBackend's graph kv_indices rows sized max_bs * max_context_len, the topk
    factor missing (sgl-project/sglang#27338, the line it fixed): a full bucket of K lanes over long
    rows writes past each row, the last one past the buffer."""

    patch = (2764, "max_bs, self.topk, self.max_context_len", "max_bs, 1, self.max_context_len")

    def _impl_class(self):
        return patched_module(TRITON, *self.patch).TritonMultiStepDraftBackend


# MLA: known bug classes of SGLang's latent attention (its latent write, MLA page-size rules, MLA
# under speculative decoding, MLA graphs), replayed in its pool, Triton and FlashInfer MLA code.


class _MLAPoolMutant(SGLangTritonBackend):
    """SGLang's MLATokenToKVPool whose set_kv_buffer has the line `patch` of memory_pool.py, run over
    the kit's latent by the Triton backend (which writes through that method)."""

    patch = (0, "", "")
    attention_kinds = ("mla",)  # scored on MLA cases only: dense runs never reach the latent write

    def _mla_pool_code(self):
        return patched_method(MEMORY_POOL, "MLATokenToKVPool", "set_kv_buffer", *self.patch)


class MLARopeNotWritten(_MLAPoolMutant):
    """The MLA latent write stores the compressed KV of new tokens but not their rope key part
    (k_pe): later steps score against stale rope columns."""

    patch = (4978, "self.kv_buffer[layer_id - self.start_layer][loc] = cache_k",
             "self.kv_buffer[layer_id - self.start_layer][loc, :, : self.kv_lora_rank] = cache_k[..., : self.kv_lora_rank]")


class MLALatentToFirstLayer(_MLAPoolMutant):
    """The MLA latent write ignores the layer (one buffer for every layer): each layer's new tokens
    land in layer 0's latent, and the layer itself reads poison."""

    patch = (4978, "self.kv_buffer[layer_id - self.start_layer][loc] = cache_k", "self.kv_buffer[0][loc] = cache_k")


class MLAValueWidthFromKeyBuffer(_TritonMutant):
    """TritonAttnBackend sizes V (its decode partials) from the latent's key row (rank + rope) instead
    of its value view (rank): the decode kernel's partial-output strides assume V's width, as in
    SGLang's hybrid SWA models with two V widths (triton_backend.py:288-292)."""

    attention_kinds = ("mla",)  # a dense pool's K and V are equally wide: the patch changes nothing there
    patch = (309, "self.v_head_dim = model_runner.token_to_kv_pool.get_value_buffer(",
             "self.v_head_dim = model_runner.token_to_kv_pool.get_key_buffer(")


class _FlashInferMLAMutant(SGLangFlashInferMLABackend):
    """FlashInferMLAAttnBackend from a copy of flashinfer_mla_backend.py with the line `patch`."""

    patch = (0, "", "")

    def _impl_class(self):
        return patched_module(FLASHINFER_MLA, *self.patch).FlashInferMLAAttnBackend


class FlashInferMLAPlansThePoolsPageSize(_FlashInferMLAMutant):
    """MLA page-size rule: the decode plan declares the pool's page size while its kv_indices are
    token slots (SGLang PRs 8593 and 9990, issue 9572: page size > 1 for FlashInfer MLA); right at
    page 1 only."""

    patch = (967, "1,", "self.attn_backend.page_size,")


class FlashInferMLADraftExtendCountsDraftsTwice(_FlashInferMLAMutant):
    """MLA under speculative decoding: the DRAFT_EXTEND_V2 fast plan adds the drafts to kv lengths
    that already count them (the draft-extend kv length class of SGLang PR 26651, in the MLA
    backend): the drafts are attended twice, the last ones past the sequence."""

    patch = (474, "self.fast_plan_kv_len_arr_cpu[:bs] = forward_batch.seq_lens_cpu[:bs]",
             "self.fast_plan_kv_len_arr_cpu[:bs] = forward_batch.seq_lens_cpu[:bs] + ndt")


class FlashInferMLAVerifyGraphWithoutDrafts(_FlashInferMLAMutant):
    """MLA graphs: the TARGET_VERIFY graph re-plan takes seq_lens as the kv lengths, leaving the
    drafts out (the eager plan counts them): replays attend the prefix only."""

    patch = (589, "self.fast_plan_kv_len_arr_cpu[:bs] = seq_lens_cpu[:bs] + ndt",
             "self.fast_plan_kv_len_arr_cpu[:bs] = seq_lens_cpu[:bs]")
