"""SGLang's own attention backends (sglang 0.5.23), unmodified, under the kit:
`sglang_triton` (TritonAttnBackend, dense and MLA), `sglang_torch_native` (TorchNativeAttnBackend),
`sglang_flex_attention` (TorchFlexAttnBackend), `sglang_flashinfer` (FlashInferAttnBackend, CUDA
only), `sglang_flashinfer_mla` (FlashInferMLAAttnBackend, MLA, CUDA only), and the multi-step draft
decode wrappers `sglang_triton_draft` (TritonMultiStepDraftBackend) and `sglang_flashinfer_draft`
(FlashInferMultiStepDraftBackend, CUDA only), and for the recurrent kinds, inside
HybridLinearAttnBackend, `sglang_gdn` (GDNAttnBackend), `sglang_mamba2` (Mamba2AttnBackend) and
`sglang_kda` (KDAAttnBackend), `sglang_gdn_hybrid` (a hybrid GDN model: TritonAttnBackend and
GDNAttnBackend), and for sparse MLA `sglang_dsa` and `sglang_dsa_triton` (DeepseekSparseAttnBackend with
FlashMLA's kernels or its Triton prefill, CUDA only). adapter.py, linear.py, hybrid.py, mamba2.py, kda.py and dsa.py map the kit's context, pools, batch and layers to SGLang's;
runtime.py imports and sets up SGLang when a backend is built (Triton's interpreter without CUDA,
chosen there before SGLang imports triton); install.py installs it (docs/sglang.md).
"""
from backends.sglang.adapter import (SGLangFlashInferBackend, SGLangFlashInferDraftBackend,
                                     SGLangFlashInferMLABackend, SGLangFlexAttentionBackend,
                                     SGLangTorchNativeBackend, SGLangTritonBackend, SGLangTritonDraftBackend)
from backends.sglang.dsa import SGLangDSABackend, SGLangDSATritonBackend
from backends.sglang.hybrid import SGLangGDNHybridBackend
from backends.sglang.kda import SGLangKDABackend
from backends.sglang.linear import SGLangGDNBackend
from backends.sglang.mamba2 import SGLangMamba2Backend

__all__ = ["SGLangDSABackend", "SGLangDSATritonBackend", "SGLangFlashInferBackend", "SGLangFlashInferDraftBackend", "SGLangFlashInferMLABackend",
           "SGLangFlexAttentionBackend", "SGLangGDNBackend", "SGLangGDNHybridBackend", "SGLangKDABackend", "SGLangMamba2Backend", "SGLangTorchNativeBackend",
           "SGLangTritonBackend", "SGLangTritonDraftBackend"]
