"""SGLang's DSA backend (DeepseekSparseAttnBackend, sglang 0.5.23: layers/attention/dsa_backend.py;
attention/nsa/ is a deprecated re-export of attention/dsa/), unmodified, for the kit's sparse MLA
kind: DeepSeek-V3.2's latent attention, each query over the keys its indexer selected.

How the model hands it the selection (models/deepseek_common/attention_forward_methods/forward_mla.py
forward_absorb_core): `attn_mqa(q_nope, k_nope, k_nope, forward_batch, q_rope=, k_rope=,
topk_indices=)`, one row per query token of the batch (the backend pads missing rows with -1,
dsa_backend.py _pad_topk_indices). What a row holds depends on where the indexer's page-table step
runs: with SGLANG_DSA_FUSE_TOPK (its default) the indexer's top-k kernel maps the selection to KV
slots itself and attention uses them as they come (_get_fused_topk_page_table); unfused, the row
holds positions in the request's req_to_token row, -1 padded, and attention maps them to slots with
its own Triton kernels (kernels/ops/attention/dsa/transform_index.py
transform_index_page_table_decode / _prefill) over the page table its metadata built. The kit runs
it unfused, under SGLang's documented pairing for that (the torch top-k backend requires
SGLANG_DSA_FUSE_TOPK=false, arg_groups/fields/exec_.py dsa_topk_backend): the kit's rows are
those positions (kit.engine.sparse), handed as they are, and SGLang's own conversion is under test.

Its kernels (`--dsa-prefill-backend` / `--dsa-decode-backend`; SGLang's resolution,
arg_groups/overrides.py _dsa_split_backend_resolution): on Hopper with a bf16 KV cache it picks
flashmla_sparse for prefill and fa3 for decode; fp8_e4m3 picks flashmla_kv (Hopper) or trtllm
(SM100+); ROCm triton; learnable-sink models flashmla_sparse for both. EXTEND and MIXED take the
prefill kernel, DECODE and TARGET_VERIFY the decode one. `sglang_dsa` runs flashmla_sparse for both
phases (fa3, SGLang's Hopper decode default, loads from sgl-kernel or a kernel hub download, neither
of which loads beside the kit's torch); `sglang_dsa_triton` runs SGLang's Triton prefill kernel
(triton_sparse_mla), which needs nothing beyond Triton (docs/sglang.md, "DSA").
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from typing import Optional

import torch

from backends.sglang.adapter import SGLangBackend, _GraphHooks
from kit.harness.protocol import library_version
from kit.modes import ForwardMode

# The architecture SGLang's DSA backend asserts (configs/model_config.py is_deepseek_dsa).
DSA_ARCH = "DeepseekV32ForCausalLM"
# The kernel each phase runs (`--dsa-prefill-backend`, `--dsa-decode-backend`).
IMPL = "flashmla_sparse"
# The packages its paths import when they run: FlashMLA's sparse kernel (the sgl-flash-mla wheel,
# kernels/ops/attention/flash_mla_interface.py), and DeepGEMM, whose paged-MQA-logits schedule the
# metadata builds for the indexer in the decode-shaped modes on CUDA (dsa_backend.py
# init_forward_metadata, dsa/utils.py resolve_paged_mqa_logits_metadata_fn).
FLASH_MLA, DEEP_GEMM = "flash_mla", "deep_gemm"
DECODE_SHAPED = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)
# SGLang runs an EXTEND or MIXED batch dense (MHA_ONE_SHOT: the model's normal path, K/V decompressed
# outside the latent pool, no selection) on SM90 and SM100-109 when its longest sequence is at most
# this many tokens (dsa_backend.py set_dsa_prefill_impl, environ.py
# SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD); the kit's absorbed call is the sparse path.
DENSE_PREFILL_KV_LEN = 2048
# SGLang's switch between the fused and the unfused top-k (environ.py SGLANG_DSA_FUSE_TOPK).
FUSE_TOPK_ENV = "SGLANG_DSA_FUSE_TOPK"
# The most query heads SGLang lets its Triton sparse prefill run (dsa_backend.py _TRITON_SPARSE_MLA_MAX_HEADS).
TRITON_MAX_HEADS = 32


@functools.lru_cache(maxsize=None)
def _load_problem(package: str) -> Optional[str]:
    """Why `package` cannot be imported here (not installed, or its extension does not load), or None."""
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed"
    try:
        importlib.import_module(package)
    except Exception as error:  # noqa: BLE001 - an extension built for another torch or CUDA: its own words
        return f"{package} does not load ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    return None


class SGLangDSABackend(_GraphHooks, SGLangBackend):
    """DeepseekSparseAttnBackend (`--attention-backend dsa`) as SGLang builds it for a DeepSeek-V3.2
    model: MLA latent pool, absorbed call, the indexer's selection per query token."""

    name = "sglang_dsa"
    sglang_class = "sglang.srt.layers.attention.dsa_backend:DeepseekSparseAttnBackend"
    server_name = "dsa"
    server_fields = {"dsa_prefill_backend": IMPL, "dsa_decode_backend": IMPL, "dsa_topk_backend": "torch"}
    attention_kinds = ("sparse_mla",)
    # Its forward_extend serves TARGET_VERIFY (the decode kernel over expanded rows) and DRAFT_EXTEND_V2;
    # the kit's sparse kind has no draft-extend cases (kit/engine/kinds/sparse_mla.py MODES).
    modes = (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)
    # No kit fp8 KV (kv_dtypes left empty): SGLang's DSA fp8 cache is its own packed layout (the
    # latent as fp8 with per-128 scales beside a bf16 rope, memory_pool.py DSATokenToKVPool,
    # dsa_kv_cache_store_fp8), read by flashmla_kv / trtllm, not a per-tensor-scaled fp8 cache.

    @classmethod
    def versions(cls):
        return dict(super().versions(), flash_mla=library_version("sgl-flash-mla"))

    @classmethod
    def supports(cls, case):
        return super().supports(case) or cls._dsa_problem(case)

    @classmethod
    def _dsa_problem(cls, case) -> Optional[str]:
        """Why SGLang's DSA backend does not run `case` as the kit calls it, or None."""
        if not torch.cuda.is_available():
            return ("DeepseekSparseAttnBackend runs on CUDA only: its constructor asks for the device's compute "
                    "capability (dsa_backend.py __init__, torch.cuda.get_device_capability), as SGLang's server "
                    "args do choosing its kernels, all CUDA ones")
        if case.dtype != "bf16":
            return (f"{case.dtype}: SGLang's sparse MLA kernels take bf16 q and KV only (FlashMLA's "
                    f"flash_mla_sparse_fwd, the Triton sparse_mla_prefill); it serves DSA models in bf16")
        if case.index_scatter:
            return ("-1 among a row's indices: SGLang's DSA backend reads a row's first min(seq_len, index_topk) "
                    "entries only (its topk_length, dsa_cache_seqlens_int32: 'Rows whose context is shorter than "
                    "index_topk have their indices tail-padded with -1', dsa_backend.py _forward_flashmla_sparse), "
                    "as its indexer's top-k writes them")
        if case.mode in (ForwardMode.EXTEND, ForwardMode.MIXED) and cls._dense_prefill(case):
            return (f"{case.mode.value} with no sequence past {DENSE_PREFILL_KV_LEN} tokens: SGLang runs it dense "
                    f"(MHA_ONE_SHOT, the model's normal path over decompressed K/V, no selection; dsa_backend.py "
                    f"set_dsa_prefill_impl), not the sparse latent attention")
        return cls._kernel_problem(case)

    @classmethod
    def _kernel_problem(cls, case) -> Optional[str]:
        """Why the kernels this backend runs do not take `case` here, or None: FlashMLA's sparse kernel."""
        if case.num_q_heads not in (64, 128) and 64 % case.num_q_heads:
            return (f"{case.num_q_heads} query heads: FlashMLA's sparse kernel takes 64 or 128, and SGLang pads "
                    f"only head counts dividing 64 (dsa_backend.py _forward_flashmla_sparse)")
        problem = _load_problem(FLASH_MLA) or (_load_problem(DEEP_GEMM) if case.mode in DECODE_SHAPED else None)
        if problem:
            return (f"{problem}: SGLang's DSA backend imports it in this mode (flash_mla: the sgl-flash-mla wheel, "
                    f"its sparse kernel; deep_gemm: the indexer's paged-MQA schedule its metadata builds); "
                    f"docs/sglang.md, 'DSA'")
        return None

    @staticmethod
    def _dense_prefill(case) -> bool:
        """Whether SGLang would take this prefill dense: an SM90 or SM100-109 device and every sequence
        at most DENSE_PREFILL_KV_LEN long."""
        major, minor = torch.cuda.get_device_capability()
        sm = major * 10 + minor
        longest = max(p + n for p, n in zip(case.prefix, case.new_lens))
        return (sm == 90 or 100 <= sm < 110) and longest <= DENSE_PREFILL_KV_LEN

    def _make_impl(self):
        """As a DeepSeek-V3.2 model runner builds it: its HF config (architecture, index_topk), no
        HiSparse, the top-k unfused."""
        layer = self.ctx.layers[0]
        config = self.runner.model_config
        config.hf_config = config.hf_text_config = self.sg.PretrainedConfig(architectures=[DSA_ARCH],
                                                                            index_topk=layer.index_topk)
        self.runner.hisparse_coordinator = None
        os.environ[FUSE_TOPK_ENV] = "0"  # read at construction (dsa/utils.py should_use_dsa_fused_topk) and per call
        return super()._make_impl()

    def _model_args(self, batch, num_tokens: int) -> dict:
        return {"topk_indices": self.topk_indices(batch, num_tokens)}

    @staticmethod
    def topk_indices(batch, num_tokens: int) -> torch.Tensor:
        """The indexer's output as the unfused top-k hands it to attention: int32 [num_tokens, index_topk],
        per query token (batch order: q's) the selected positions in its request's req_to_token row,
        -1 padded (the kit's rows, kit.engine.sparse)."""
        return batch.topk_indices[:num_tokens].to(torch.int32).contiguous()


class SGLangDSATritonBackend(SGLangDSABackend):
    """The same backend with `--dsa-prefill-backend triton_sparse_mla`: SGLang's own Triton sparse-MLA
    prefill kernel (kernels/ops/attention/dsa/triton_sparse_mla_prefill.py), a CUDA choice for SM90
    and newer up to 32 query heads (dsa_backend.py _validate_triton_sparse_mla_backend), which needs
    no package beyond Triton. It serves the prefill phase only (EXTEND, MIXED): SGLang has no Triton
    sparse decode on CUDA (its `triton` DSA backend is ROCm's, arg_groups/overrides.py
    _check_dsa_backend_constraints), so the decode-shaped modes are sglang_dsa's."""

    name = "sglang_dsa_triton"
    server_fields = dict(SGLangDSABackend.server_fields, dsa_prefill_backend="triton_sparse_mla")
    modes = (ForwardMode.EXTEND, ForwardMode.MIXED)

    @classmethod
    def _kernel_problem(cls, case) -> Optional[str]:
        if torch.cuda.get_device_capability()[0] < 9:
            return "triton_sparse_mla runs on SM90 (Hopper) and newer (dsa_backend.py _validate_triton_sparse_mla_backend)"
        if case.num_q_heads > TRITON_MAX_HEADS:
            return (f"{case.num_q_heads} query heads: SGLang validates triton_sparse_mla up to {TRITON_MAX_HEADS} "
                    f"per rank and refuses more (dsa_backend.py _validate_triton_sparse_mla_backend)")
        return None
