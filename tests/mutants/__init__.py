"""The mutant catalog: one line per mutant (bug class -> backend variant -> the
failure class the kit must report). `python -m kit.mutate` runs it.

`cpu`: whether the CPU run (Triton interpreter, emulated graphs) can catch it.
`harmless`: why a mutant changes nothing the contract judges in this backend
(shown in the table with the reason; a negative length only hurts a kernel that
reads it as a size, which the in-box ones do not).
Emulated graphs call forward() again at each replay, with the backend's Python
state put back to its capture-time values, so stale pointers and grids baked at
capture are caught on CPU too.
"""
from kit.engine.layer import model_layers
from kit.engine.profile import SGLANG
from kit.modes import Exec, ForwardMode
from kit.mutation import Mutant
from tests.mutants import hybrid, linear, sglang_linear, vllm_linear

D, E, TV, DE = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2
MX, DD = ForwardMode.MIXED, ForwardMode.DRAFT_DECODE
SPARSE_MODES = (D, E, MX, TV)  # the modes sparse MLA is served in (kit/engine/kinds/sparse_mla.py)
ALL_MODES = (D, E, TV, DE)
EAGER, GRAPH = (Exec.EAGER,), (Exec.GRAPH,)
T = "tests.mutants.triton:"
FI = "tests.mutants.flashinfer:"
SG = "tests.mutants.sglang:"
MLA = "tests.mutants.mla:"
FP8 = "tests.mutants.fp8:"
SINK = "tests.mutants.sinks:"
SPARSE = "tests.mutants.sparse_mla:"
LSE = "tests.mutants.lse:"
VL = "tests.mutants.vllm:"
G, K, KV, C = ("graph",), ("kernel",), ("kv-write",), ("crash",)
# Reading or writing past a buffer the backend sized itself: wrong output where the
# stray access lands in readable memory, a crash where it corrupts the heap.
OOB = K + C


# The cases a bug class shows in (Mutant.reaches), by the model's layers: a hybrid model's
# other layer brings a window or a cap the case's own layer lacks.
def _any_layer(has):
    return lambda case: any(has(layer) for layer in model_layers(case))


WINDOWED = _any_layer(lambda layer: layer.sliding_window_size >= 0)
CAPPED = _any_layer(lambda layer: layer.logit_cap > 0)
TREE = lambda c: c.topk > 1  # noqa: E731
FP8_KV = lambda c: c.kv_dtype is not None  # noqa: E731
SINKS = lambda c: c.sinks  # noqa: E731
# A tree whose draft count is not its steps + 1, at bs > 1 (a stride of steps + 1 shows there only).
TREE_DRAFTS = lambda c: c.topk > 1 and c.steps is not None and c.steps + 1 != c.new and c.bs > 1  # noqa: E731
# A full batch-size bucket (no padded row dilutes its keys) of K lanes each, whose keys come to twice a
# row of the longest request per request: a row sized without the topk factor overflows.
FULL_TREE_BUCKET = lambda c: (c.topk > 1 and c.bs in SGLANG.batch_sizes  # noqa: E731
                              and sum(c.prefix) * c.topk > 2 * c.bs * max(c.prefix))
# At the model's context edge, every committed length within `steps` of the others (so of the context
# length: a variant adds at most 2 * page + 3 to each, kit.engine.variants).
CONTEXT_EDGE = lambda c: (c.context_edge and len(set(c.prefix)) == 1  # noqa: E731
                          and (c.steps or c.new - 1) > 2 * c.page + 3)
MIXED_UNALIGNED = lambda c: c.page > 1 and any(p % c.page for p in c.prefix)  # noqa: E731

MUTANTS = [
    # Mutant 1 lives in a capture/replay-style backend: in the two-phase Triton backend the
    # graph records its device metadata with the capture's batch size, where it cannot go stale.
    Mutant(1, "replay_bs_from_buffer", FI + "ReplayBsFromBuffer", G + C, (D, TV, DE), GRAPH, cpu=False),
    Mutant(2, "draft_extend_counts_drafts_twice", T + "DraftExtendCountsDraftsTwice", K, (DE,),
           EAGER + GRAPH, cpu=True),
    Mutant(3, "draft_extend_no_clamp", T + "DraftExtendNoClamp", G, (DE,), GRAPH, cpu=False,
           harmless="every length in our kernels is a loop bound: a negative prefix is an empty loop, "
                    "and the padded row's output is the same with or without the clamp"),
    Mutant(3, "draft_extend_no_clamp_flashinfer", FI + "DraftExtendNoClamp", G + C, (DE,), GRAPH, cpu=False,
           harmless="the adapter plans kv = prefix + drafts in one paged pass, so the unclamped padded row "
                    "plans kv 1 < its query rows, never a negative length: the padded row attends less "
                    "(still finite), real rows are untouched"),
    Mutant(4, "replay_rebinds_indptr", T + "ReplayRebindsIndptr", G, (E, TV), GRAPH, cpu=True),
    Mutant(5, "splits_from_capture_host_value", T + "SplitsFromCaptureHostValue", G, (D,), GRAPH, cpu=True),
    Mutant(6, "padded_rows_write_real_slot", T + "PaddedRowsWriteRealSlot", KV, ALL_MODES, GRAPH,
           cpu=True),
    Mutant(7, "window_one_short", T + "WindowOneShort", K, ALL_MODES, EAGER, cpu=True, reaches=WINDOWED),
    Mutant(7, "window_one_long", T + "WindowOneLong", K, ALL_MODES, EAGER, cpu=True, reaches=WINDOWED),
    Mutant(8, "verify_ignores_tree_mask", T + "VerifyIgnoresTreeMask", K, (TV,), EAGER, cpu=True, reaches=TREE),
    Mutant(9, "decode_reads_one_past", T + "DecodeReadsOnePast", OOB, (D,), EAGER, cpu=True),
    Mutant(9, "decode_reads_one_short", T + "DecodeReadsOneShort", K, (D,), EAGER, cpu=True),
    Mutant(9, "prefix_reads_one_short", T + "PrefixReadsOneShort", K, (E, TV, DE), EAGER, cpu=True),
    Mutant(10, "kv_indices_from_stale_sum", T + "KvIndicesFromStaleSum", OOB, ALL_MODES, EAGER, cpu=True),
    Mutant(10, "seq_lens_sum_read_undeclared", T + "SeqLensSumReadUndeclared", C, ALL_MODES, EAGER, cpu=True),
    Mutant(11, "extend_padding_not_routed", T + "ExtendPaddingNotRouted", G, (E,), GRAPH, cpu=True),
    Mutant(12, "logit_cap_ignored_in_verify", T + "LogitCapIgnoredInVerify", K, (TV,), EAGER, cpu=True,
           reaches=CAPPED),
    Mutant(13, "verify_window_by_index", T + "VerifyWindowByIndex", K, (TV,), EAGER, cpu=True,
           reaches=lambda c: WINDOWED(c) and TREE(c)),
    Mutant(14, "draft_extend_positions_from_seq_lens", T + "DraftExtendPositionsFromSeqLens", K, (DE,), EAGER,
           cpu=True, reaches=WINDOWED),
    Mutant(15, "output_in_fp32", T + "OutputInFp32", K, ALL_MODES, EAGER + GRAPH, cpu=True,
           reaches=lambda c: c.dtype != "fp32"),
    # On CPU the host is the case's device: only a GPU run can tell.
    Mutant(15, "output_on_host", T + "OutputOnHost", K, ALL_MODES, EAGER, cpu=False),
    # Patterns of the production-harness issue (numbered from 20).
    # In the two-phase Triton backend only the replay hook's own work can go wrong: EXTEND's
    # metadata and DRAFT_EXTEND_V2's inputs (decode and verify metadata is recorded in the graph).
    Mutant(20, "bs_from_buffer_length", T + "BsFromBufferLength", G + C, (E, DE), GRAPH, cpu=True),
    Mutant(21, "metadata_cached_by_shape", T + "MetadataCachedByShape", K, ALL_MODES, EAGER, cpu=True),
    Mutant(22, "extend_grid_from_request_count", T + "ExtendGridFromRequestCount", G, (E,), GRAPH, cpu=True),
    Mutant(23, "first_layer_config_for_all", T + "FirstLayerConfigForAll", K, ALL_MODES, EAGER, cpu=True,
           reaches=lambda c: c.hybrid),
    # Real-code mutants (numbered from 30): known SGLang bugs replayed as one-line patches of a copy
    # of SGLang's own triton_backend.py, run through the sglang_triton adapter.
    # In DECODE and TARGET_VERIFY a bs taken from a full-capacity buffer only fills rows past the batch
    # too (TARGET_VERIFY's replay takes it so already, triton_backend.py:1425): DRAFT_EXTEND_V2 shows it.
    Mutant(30, "sglang_replay_bs_from_buffer", SG + "ReplayBsFromBuffer", G + C, (DE,), GRAPH, cpu=True),
    Mutant(31, "sglang_draft_extend_counts_drafts_twice", SG + "DraftExtendCountsDraftsTwice", G, (DE,), GRAPH,
           cpu=True),
    Mutant(32, "sglang_verify_mask_not_refreshed", SG + "VerifyMaskNotRefreshed", G, (TV,), GRAPH, cpu=True),
    Mutant(33, "sglang_replay_writes_fresh_kv_indptr", SG + "ReplayWritesFreshKvIndptr", G, (D, TV, DE), GRAPH,
           cpu=True),
    Mutant(34, "sglang_draft_extend_no_clamp", SG + "DraftExtendNoClamp", G + C, (DE,), GRAPH, cpu=True,
           harmless="padded rows follow the real ones, so their negative lengths only lower kv_indptr past "
                    "the real rows; SGLang's kernels take lengths as loop bounds (an empty loop), and the "
                    "padded rows' output stays finite"),
    # Real-code MLA mutants (35 to 39, and 46): SGLang's latent write (memory_pool.py), Triton's MLA
    # V width, and FlashInfer MLA's page-size rule, speculative and graph paths.
    # 35 and 36 break every mode's write; scored on the modes whose CPU MLA smoke cases are short (the
    # DECODE one runs SGLang's kernel at DeepSeek's width, ~100 s in the interpreter). CPU-catchable
    # there (kv-write in every such run), marked for the CPU once the catalog has MLA smoke cases.
    Mutant(35, "sglang_mla_rope_not_written", SG + "MLARopeNotWritten", KV + K, (E, TV, DE), EAGER, cpu=False),
    Mutant(36, "sglang_mla_latent_to_first_layer", SG + "MLALatentToFirstLayer", KV + K, (E, TV, DE), EAGER,
           cpu=False),
    # Decode partials sized for the wrong V width: wrong output (the GPU), or a write past them that
    # crashes the DeepSeek-width decode graph (the CPU's only MLA decode that SGLang's kernel tiles,
    # ~200 s in the interpreter: scored on the GPU).
    Mutant(37, "sglang_mla_v_width_from_key_buffer", SG + "MLAValueWidthFromKeyBuffer", OOB, (D,), EAGER + GRAPH,
           cpu=False),
    Mutant(38, "sglang_flashinfer_mla_plans_pool_page_size", SG + "FlashInferMLAPlansThePoolsPageSize", K + C, (D,),
           EAGER, cpu=False),
    Mutant(39, "sglang_flashinfer_mla_draft_extend_counts_drafts_twice",
           SG + "FlashInferMLADraftExtendCountsDraftsTwice", K + C, (DE,), EAGER, cpu=False),
    Mutant(46, "sglang_flashinfer_mla_verify_graph_without_drafts", SG + "FlashInferMLAVerifyGraphWithoutDrafts",
           G + C, (TV,), GRAPH, cpu=False),
    # Real-code vLLM mutants (numbered from 70): bug classes of vLLM's metadata builders, impls and KV
    # writer, one-line patches of a copy of vLLM's own module run through the vllm_* adapters.
    # TRITON_ATTN's run on CPU (Triton's interpreter, emulated graphs).
    Mutant(70, "vllm_triton_seq_lens_one_short", VL + "TritonSeqLensOneShort", K, (D, E, TV), EAGER, cpu=True),
    Mutant(71, "vllm_triton_query_start_loc_copied", VL + "TritonQueryStartLocCopied", G, (D, E, TV), GRAPH,
           cpu=True),
    Mutant(72, "vllm_triton_window_one_long", VL + "TritonWindowOneLong", K, (D, E, TV), EAGER, cpu=True,
           reaches=WINDOWED),
    Mutant(73, "vllm_triton_sinks_ignored", VL + "TritonSinksIgnored", K, (D, E, TV), EAGER, cpu=True, reaches=SINKS),
    # A padded token's write lands one slot before the layer's cache: the other layer's last slot
    # (kv-write), or before the pool's memory (a crash, or corruption seen later).
    Mutant(74, "vllm_triton_padded_slots_written", VL + "TritonPaddedSlotsWritten", KV + C, (D, TV), GRAPH,
           cpu=True),
    # FLEX graphs run on CUDA only (PyTorch's CPU flex template refuses vLLM's capture-time block mask).
    Mutant(75, "vllm_flex_doc_ids_not_persistent", VL + "FlexDocIdsNotPersistent", G, (D, E), GRAPH, cpu=False),
    Mutant(76, "vllm_fa3_scheduler_metadata_not_persistent", VL + "FlashAttnSchedulerMetadataNotPersistent",
           G + C, (D, E, TV), GRAPH, cpu=False),
    # CPU-catchable (TRITON_MLA's DeepSeek-width decode case), but a run takes minutes in the
    # interpreter: scored by `python -m kit.mutate`, not in the suite.
    Mutant(77, "vllm_mla_decode_seq_lens_one_short", VL + "MLADecodeSeqLensOneShort", K, (D, TV), EAGER, cpu=False),
    # Where vLLM's runner puts a step's decode rows (first: the profile's row order) and how its builders split
    # them from prefill rows: TRITON_MLA's MIXED smoke cases at DeepSeek's width, a run of a minute or two in the
    # interpreter; and its decode's KV splits (one per 512 keys), reached past 1,024 keys (the DECODE smoke case
    # mla_deepseek_h128_bs1_long_p64_fp16, which catches it on CPU: minutes a run in the interpreter, scored by
    # `python -m kit.mutate`, not in the suite).
    Mutant(78, "vllm_mla_prefill_rows_from_first", VL + "MLAPrefillRowsFromFirst", K + C, (MX,), EAGER, cpu=True),
    Mutant(79, "vllm_mla_split_counts_decode_rows_as_tokens", VL + "MLASplitCountsDecodeRowsAsTokens", K + C, (MX,),
           EAGER, cpu=True, reaches=lambda c: bool(c.steps)),
    Mutant(82, "vllm_mla_decode_split_length_floored", VL + "MLADecodeSplitLengthFloored", K, (D,), EAGER, cpu=False,
           reaches=lambda c: max(c.prefix) >= 1024),
    # What a backend is handed (numbered from 50): q, k and v are views of a fused QKV row, and
    # the caller's to keep.
    Mutant(50, "strides_ignored", T + "StridesIgnored", K, ALL_MODES, EAGER + GRAPH, cpu=True,
           reaches=lambda c: c.inputs == "fused_qkv"),
    Mutant(51, "q_scaled_in_place", T + "QScaledInPlace", K, ALL_MODES, EAGER + GRAPH, cpu=True),
    # MLA bug classes (numbered from 40), in the torch_native backend: MLA cases only.
    Mutant(40, "mla_rope_dropped_from_score", MLA + "RopeDroppedFromScore", K, ALL_MODES, EAGER, cpu=True),
    Mutant(41, "mla_values_from_rope_tail", MLA + "ValuesFromRopeTail", K, ALL_MODES, EAGER, cpu=True),
    Mutant(42, "mla_scale_from_head_dim", MLA + "ScaleFromHeadDim", K, ALL_MODES, EAGER, cpu=True),
    Mutant(43, "mla_latent_to_wrong_layer", MLA + "LatentToWrongLayer", KV, ALL_MODES, EAGER, cpu=True),
    Mutant(43, "mla_latent_to_wrong_page", MLA + "LatentToWrongPage", KV, ALL_MODES, EAGER, cpu=True),
    Mutant(44, "mla_rope_not_written", MLA + "RopeNotWritten", KV, ALL_MODES, EAGER, cpu=True),
    # fp8 KV cache scale bug classes (numbered from 60), in the torch_native backend: fp8 cases only.
    Mutant(60, "fp8_scale_applied_twice", FP8 + "ScaleAppliedTwice", K, ALL_MODES, EAGER, cpu=True, reaches=FP8_KV),
    Mutant(61, "fp8_scale_ignored", FP8 + "ScaleIgnored", K, ALL_MODES, EAGER, cpu=True, reaches=FP8_KV),
    Mutant(62, "fp8_k_scale_used_for_v", FP8 + "KScaleUsedForV", K, ALL_MODES, EAGER, cpu=True,
           reaches=lambda c: FP8_KV(c) and not c.is_mla),
    # Batch invariance bug classes (numbered from 80), in the Triton backend (batch_invariant): a request's
    # split-KV merge chosen from its batch. A cap by batch size shows only on a request of more splits than a
    # batch of a few more requests allows (backends/triton/metadata.py: one per 32 keys on CPU).
    Mutant(80, "decode_splits_by_batch_size", T + "SplitsByBatchSize", K, (D,), EAGER + GRAPH, cpu=True,
           reaches=lambda c: max(c.prefix) >= 128),
    Mutant(81, "decode_splits_from_longest_request", T + "SplitsFromLongestRequest", K, (D,), EAGER + GRAPH,
           cpu=True),
    # Attention sink bug classes (numbered from 47): sink cases only (`reaches`); elsewhere the plain backend.
    Mutant(47, "sink_ignored", SINK + "SinkIgnored", K, ALL_MODES, EAGER, cpu=True, reaches=SINKS),
    Mutant(48, "sink_counted_as_value", SINK + "SinkCountedAsValue", K, ALL_MODES, EAGER, cpu=True, reaches=SINKS),
    # Only a request of more than one KV split shows it (backends/triton/metadata.py: one per 32 keys on CPU).
    Mutant(49, "sink_folded_per_split", SINK + "SinkFoldedPerSplit", K, (D,), EAGER, cpu=True,
           reaches=SINKS),
    # The multi-step draft decode and its speculative graphs, MIXED batches (numbered from 70). A graph
    # buffer sized short is written past by the replay hooks (guarded: what init_cuda_graph_state and the
    # capture hooks allocate carries canaries), or by the graph: graph, or a crash where it corrupts.
    Mutant(70, "draft_graph_keys_without_topk", T + "DraftGraphKeysWithoutTopk", G + C, (DD,), GRAPH, cpu=True,
           reaches=FULL_TREE_BUCKET),
    Mutant(70, "sglang_draft_graph_keys_without_topk", SG + "DraftGraphKeysWithoutTopk", G + K + C, (DD,), GRAPH,
           cpu=False, reaches=FULL_TREE_BUCKET),
    Mutant(71, "draft_extend_rows_from_steps", T + "DraftExtendRowsFromSteps", G, (DE,), GRAPH, cpu=True,
           reaches=TREE_DRAFTS),
    Mutant(71, "sglang_draft_extend_rows_from_steps", SG + "DraftExtendRowsFromSteps", G, (DE,), GRAPH, cpu=False,
           reaches=TREE_DRAFTS),
    Mutant(72, "draft_graph_keys_from_context_length", T + "DraftGraphKeysFromContextLength", G + C, (DD,), GRAPH,
           cpu=True, reaches=CONTEXT_EDGE),
    Mutant(73, "draft_step_lengths_not_refreshed", T + "DraftStepLengthsNotRefreshed", K, (DD,), EAGER + GRAPH,
           cpu=True, reaches=lambda c: (c.steps or c.new - 1) >= 3),
    Mutant(74, "draft_lanes_read_lane_zero", T + "DraftLanesReadLaneZero", K, (DD,), EAGER + GRAPH, cpu=True,
           reaches=TREE),
    Mutant(75, "mixed_prefixes_page_aligned", T + "MixedPrefixesPageAligned", K, (MX,), EAGER + GRAPH, cpu=True,
           reaches=MIXED_UNALIGNED),
    Mutant(76, "mixed_prefixes_uncounted", T + "MixedPrefixesUncounted", K, (MX,), EAGER, cpu=True),
    # Sparse MLA (DeepSeek-V3.2's DSA): the in-box torch_sparse_mla with one bug of a sparse kernel's index path.
    Mutant(90, "sparse_index_through_wrong_page", SPARSE + "IndexThroughWrongPage", K, SPARSE_MODES, EAGER, cpu=True),
    Mutant(91, "sparse_padding_not_skipped", SPARSE + "PaddingNotSkipped", K, SPARSE_MODES, EAGER, cpu=True),
    Mutant(92, "sparse_block_stride_ignored", SPARSE + "BlockStrideIgnored", K, SPARSE_MODES, EAGER, cpu=True),
    Mutant(93, "sparse_topk_truncated", SPARSE + "TopkTruncated", K, SPARSE_MODES, EAGER, cpu=True),
    Mutant(94, "sparse_padding_clamped_to_length", SPARSE + "PaddingClampedToLength", K, SPARSE_MODES, EAGER,
           cpu=True),
    Mutant(95, "sparse_empty_row_not_zeroed", SPARSE + "EmptyRowNotZeroed", G, SPARSE_MODES, GRAPH, cpu=True),
    # The log-sum-exp a backend returns beside its output (returns_lse): right outputs, the LSE wrong.
    Mutant(96, "lse_in_log2", LSE + "LseInLog2", K, ALL_MODES, EAGER, cpu=True),
    Mutant(96, "triton_lse_in_log2", LSE + "TritonLseInLog2", K, ALL_MODES, GRAPH, cpu=True),
    Mutant(96, "flashinfer_lse_in_log2", LSE + "FlashInferLseInLog2", K, ALL_MODES, GRAPH, cpu=False),
    Mutant(97, "lse_without_sinks", LSE + "LseWithoutSinks", K, ALL_MODES, EAGER, cpu=True, reaches=SINKS),
]
# The recurrent kinds (GDN, Mamba2, KDA), numbered from 100: tests/mutants/linear.py.
MUTANTS += linear.MUTANTS
# SGLang's recurrent backends' real code, numbered from 120: tests/mutants/sglang_linear.py.
MUTANTS += sglang_linear.MUTANTS
# vLLM's recurrent backends' real code, numbered from 140: tests/mutants/vllm_linear.py.
MUTANTS += vllm_linear.MUTANTS
# A hybrid model's routing of layer ids to its pools, numbered from 150: tests/mutants/hybrid.py.
MUTANTS += hybrid.MUTANTS
