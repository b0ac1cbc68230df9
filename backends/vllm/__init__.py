"""vLLM's own attention backends (vllm 0.33.0), unmodified, under the kit: `vllm_triton_attn`
(TRITON_ATTN), `vllm_flex_attention` (FLEX_ATTENTION), `vllm_flash_attn` (FLASH_ATTN, CUDA),
`vllm_flashinfer` (FLASHINFER, CUDA), and for MLA models `vllm_triton_mla` (TRITON_MLA),
`vllm_flashmla` (FLASHMLA, CUDA) and `vllm_flash_attn_mla` (FLASH_ATTN_MLA, CUDA), for sparse MLA
(DeepSeek-V3.2) `vllm_flashmla_sparse` (FLASHMLA_SPARSE, CUDA) and `vllm_flash_attn_mla_sparse`
(FLASH_ATTN_MLA_SPARSE, CUDA), for gated delta net layers `vllm_gdn` (GDN_ATTN, CUDA), and for Mamba2
layers `vllm_mamba2` (MAMBA2_ATTN, CUDA). adapter.py, mla.py, sparse_mla.py, gdn.py and mamba2.py map
the kit's context, pools, batch and layers to vLLM's (recurrent.py the recurrent layers' batch);
runtime.py imports and sets up vLLM when a backend is asked about
a case or built; environment.py is what vLLM needs of the process without CUDA (set there, before
vllm is first imported); install.py installs it (docs/vllm.md).
"""
from backends.vllm.adapter import (VllmFlashAttnBackend, VllmFlashInferBackend, VllmFlexAttentionBackend,
                                   VllmTritonAttnBackend)
from backends.vllm.gdn import VllmGdnBackend
from backends.vllm.mamba2 import VllmMamba2Backend
from backends.vllm.mla import VllmFlashAttnMLABackend, VllmFlashMLABackend, VllmTritonMLABackend
from backends.vllm.sparse_mla import VllmFlashAttnMLASparseBackend, VllmFlashMLASparseBackend

__all__ = ["VllmFlashAttnBackend", "VllmFlashAttnMLABackend", "VllmFlashAttnMLASparseBackend", "VllmFlashInferBackend",
           "VllmFlashMLABackend", "VllmFlashMLASparseBackend", "VllmFlexAttentionBackend", "VllmGdnBackend",
           "VllmMamba2Backend", "VllmTritonAttnBackend", "VllmTritonMLABackend"]
