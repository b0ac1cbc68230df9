"""Real-code mutants of vLLM's attention backends: bug classes replayed on vLLM's own source. Each
is a one-line patch of a copy of a vllm module (tests.mutants.patching), whose backend class (its
metadata builder and impl) the adapter then runs in place of vLLM's own. Line numbers are vllm
0.33.0's (the adapter's pin); a patch whose line no longer reads as expected raises, naming it."""
from __future__ import annotations

from backends.vllm.adapter import VllmFlashAttnBackend, VllmFlexAttentionBackend, VllmTritonAttnBackend
from backends.vllm.mla import VllmTritonMLABackend
from tests.mutants import patching

TRITON_ATTN = "vllm.v1.attention.backends.triton_attn"
RESHAPE_AND_CACHE = "vllm.v1.attention.ops.triton_reshape_and_cache_flash"
FLEX = "vllm.v1.attention.backends.flex_attention"
FLASH_ATTN = "vllm.v1.attention.backends.flash_attn"
MLA = "vllm.model_executor.layers.attention.mla_attention"
UTILS = "vllm.v1.attention.backends.utils"
DECODE_ATTENTION = "vllm.v1.attention.ops.triton_decode_attention"


def patched(module: str, line: int, old: str, new: str):
    """tests.mutants.patching's copy, after vLLM's set-up (its environment, the KV-write ops)."""
    import backends.vllm.runtime  # noqa: F401

    return patching.patched_module(module, line, old, new)


class _PatchedBackend:
    """The vLLM backend class of a copy of its module with the line `patch` = (line, old, new)."""

    module, backend = "", ""
    patch = (0, "", "")

    def _vllm_backend(self):
        return getattr(patched(self.module, *self.patch), self.backend)


class _TritonAttnMutant(_PatchedBackend, VllmTritonAttnBackend):
    module, backend = TRITON_ATTN, "TritonAttentionBackend"


class TritonSeqLensOneShort(_TritonAttnMutant):
    """The builder hands the kernels seq_lens one short (a length that leaves out the token being
    decoded): every request attends one key fewer."""

    patch = (245, "seq_lens = common_attn_metadata.seq_lens", "seq_lens = common_attn_metadata.seq_lens - 1")


class TritonQueryStartLocCopied(_TritonAttnMutant):
    """The builder hands the kernels a copy of query_start_loc instead of the runner's persistent
    buffer: right eagerly, while a graph keeps reading the copy made at its capture."""

    patch = (244, "query_start_loc = common_attn_metadata.query_start_loc",
             "query_start_loc = common_attn_metadata.query_start_loc.clone()")


class TritonWindowOneLong(_TritonAttnMutant):
    """The impl's window takes the model's sliding window as its left extent, one key more than it
    counts (the window includes the query's own key)."""

    patch = (508, "self.sliding_window = (sliding_window - 1, 0)", "self.sliding_window = (sliding_window, 0)")


class TritonSinksIgnored(_TritonAttnMutant):
    """The decoder path calls the unified kernel without the layer's attention sinks."""

    patch = (721, "sinks=self.sinks,", "sinks=None,")


class TritonPaddedSlotsWritten(VllmTritonAttnBackend):
    """vLLM's Triton KV writer no longer skips slot -1 (a padded token under a graph): the padded
    tokens' K and V land one slot before the cache's first block."""

    patch = (64, "if slot_idx < 0:", "if slot_idx < -1:")

    def _vllm_backend(self):
        original = self.backend_cls()
        writer = patched(RESHAPE_AND_CACHE, *self.patch).triton_reshape_and_cache_flash
        impl = original.get_impl_cls()
        update = patching.rebound(impl.do_kv_cache_update, impl.do_kv_cache_update.__globals__,
                                  triton_reshape_and_cache_flash=writer)
        mutant = type(impl.__name__, (impl,), {"do_kv_cache_update": update})
        return type(original.__name__, (original,), {"get_impl_cls": staticmethod(lambda: mutant)})


class FlexDocIdsNotPersistent(_PatchedBackend, VllmFlexAttentionBackend):
    """FLEX's metadata keeps its freshly computed token-to-request map instead of copying it into the
    builder's persistent buffer: right eagerly, while a graph keeps the map of its capture."""

    module, backend = FLEX, "FlexAttentionBackend"
    patch = (828, "self.doc_ids = copy_to_persistent(self.persistent_doc_ids, self.doc_ids)", "pass")


class FlashAttnSchedulerMetadataNotPersistent(_PatchedBackend, VllmFlashAttnBackend):
    """FA3's ahead-of-time scheduler metadata returned fresh instead of from the builder's persistent
    buffer under full graphs: a graph keeps launching with the split plan of its capture."""

    module, backend = FLASH_ATTN, "FlashAttentionBackend"
    patch = (682, "return self.scheduler_metadata[:n]", "return scheduler_metadata")


def _mla_builder(backend, build):
    """`backend` (a vLLM MLA backend class) whose builder's build() is `build`."""
    original = backend.get_builder_cls()
    builder = type(original.__name__, (original,), {"build": build})
    return type(backend.__name__, (backend,), {"get_builder_cls": staticmethod(lambda: builder)})


class _MLABuildMutant(VllmTritonMLABackend):
    """TRITON_MLA whose builder's build() is MLACommonMetadataBuilder's with the line `patch`
    (mla_attention.py registers torch ops at import: only the method is compiled again)."""

    patch = (0, "", "")

    def _vllm_backend(self):
        import backends.vllm.runtime  # noqa: F401 - vLLM's set-up first

        return _mla_builder(self.backend_cls(), patching.patched_function(MLA, "MLACommonMetadataBuilder.build",
                                                                          *self.patch))


class MLADecodeSeqLensOneShort(_MLABuildMutant):
    """The MLA builder's decode metadata takes seq_lens one short: each decode row attends one latent
    row fewer."""

    patch = (2700, "seq_lens_device=seq_lens[:num_decodes],", "seq_lens_device=seq_lens[:num_decodes] - 1,")


class MLAPrefillRowsFromFirst(_MLABuildMutant):
    """The MLA builder's prefill metadata starts at the batch's first row, not past the decode rows:
    right wherever the prefill rows come first (SGLang's order), wrong in the decode-first order vLLM's
    runner hands (reorder_batch_to_split_decodes_and_prefills)."""

    patch = (2621, "reqs_start = num_decodes  # prefill_start", "reqs_start = 0  # prefill_start")


class MLASplitCountsDecodeRowsAsTokens(VllmTritonMLABackend):
    """split_decodes_and_prefills counts the decode rows' tokens as one a row: right while every decode
    row has one token, wrong where decode rows verifying drafts (1 + k tokens) sit beside prefill rows."""

    patch = (906, "num_decode_tokens = query_start_loc[first_prefill].item()", "num_decode_tokens = first_prefill")

    def _vllm_backend(self):
        import backends.vllm.runtime  # noqa: F401 - vLLM's set-up first
        from vllm.model_executor.layers.attention import mla_attention

        split = patched(UTILS, *self.patch).split_decodes_and_prefills
        build = mla_attention.MLACommonMetadataBuilder.build
        return _mla_builder(self.backend_cls(), patching.rebound(build, build.__globals__,
                                                                  split_decodes_and_prefills=split))


class MLADecodeSplitLengthFloored(VllmTritonMLABackend):
    """TRITON_MLA's decode kernel rounds each KV split's length down, not up: the last keys of a
    request whose length the split count does not divide are never read. Only past one split (vLLM
    splits from 1,024 keys)."""

    patch = (352, "kv_len_per_split = tl.cdiv(cur_batch_seq_len, NUM_KV_SPLITS)",
             "kv_len_per_split = cur_batch_seq_len // NUM_KV_SPLITS")

    def _vllm_backend(self):
        decode = patched(DECODE_ATTENTION, *self.patch).decode_attention_fwd
        backend = self.backend_cls()
        impl = backend.get_impl_cls()
        forward = patching.rebound(impl.forward_mqa, impl.forward_mqa.__globals__, decode_attention_fwd=decode)
        mutant = type(impl.__name__, (impl,), {"forward_mqa": forward})
        return type(backend.__name__, (backend,), {"get_impl_cls": staticmethod(lambda: mutant)})
