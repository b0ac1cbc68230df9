"""vLLM's MLA backends behind the kit's latent contract, through vLLM's own MLAAttention layer.

The kit hands an MLA layer the absorbed query (q_nope . W_UK, then q_pe: [T, H, rank + rope]), the
latent row (c_kv, then k_pe: [T, 1, rank + rope]) and judges the latent output ([T, H, rank]).
vLLM's layer takes the model's query, c_kv and k_pe, absorbs W_UK itself, and applies W_UV to the
latent output; its prefill rows attend keys and values decompressed through kv_b_proj. With
qk_nope_head_dim = v_head_dim = rank and kv_b_proj the identity of each head (`_UpProjection`),
each of these is the identity: the layer computes exactly the kit's latent attention, on its decode
path (forward_mqa) and its prefill path (forward_mha) alike.

vLLM's MLA prefill backends take the head sizes of real models (on Hopper only FLASH_ATTN, with
DeepSeek's 128 + 64 / 128 and a few others: prefill/flash_attn.py:313); where the platform's
selector refuses the latent's, the layer is built with the one it picks for DeepSeek's sizes and
the modes whose rows reach the prefill path read unsupported (`runtime.mla_prefill`).
"""
from __future__ import annotations

from typing import Optional

import torch

from backends.vllm.adapter import VllmBackend, layer_name, model_of, runtime
from kit.modes import ForwardMode


class _UpProjection(torch.nn.Module):
    """The model's kv_b_proj for the kit's latent contract: per head, W_UK and W_UV the identity
    ([heads * 2 * rank, rank], vLLM's [out, in] layout: split_kv_b_proj, mla_attention.py:408), no
    quantization, returning (output, bias) as vLLM's linear layers do."""

    def __init__(self, rank: int, heads: int, dtype: torch.dtype):
        super().__init__()
        eye = torch.eye(rank, dtype=dtype)
        self.weight = torch.nn.Parameter(torch.cat([eye, eye] * heads), requires_grad=False)
        self.quant_method = None

    def forward(self, x):
        return x @ self.weight.T, None


# The modes whose batches vLLM's MLA builders send (in part) to the prefill path: ragged query
# lengths (split_decodes_and_prefills, backends/utils.py:837).
PREFILL_MODES = (ForwardMode.EXTEND.value, "mixed")


def refusals(impl: str, where: str) -> dict:
    """What an MLA backend refuses of a layer (VllmBackend.impl_refuses): the soft cap, which
    MLAAttention never passes on (it builds its impl with logits_soft_cap=None, mla_attention.py:584),
    and a window, which `impl` raises for (at `where`)."""
    return {"cap": "logit soft cap: vLLM's MLAAttention takes none (mla_attention.py:584)",
            "window": f"sliding window: {impl} raises NotImplementedError for it ({where})"}


class VllmMLABackend(VllmBackend):
    attention_kinds = ("mla",)

    @classmethod
    def _refused(cls, case) -> Optional[str]:
        rt = runtime()
        problem = super()._refused(case)
        if problem is None and case.is_mla and not rt.MLACommonBackend.supports_head_size(case.head_dim):
            problem = (f"MLA width {case.kv_lora_rank} + {case.rope_dim}: vLLM's MLA metadata takes latent widths "
                       f"{rt.MLACommonBackend.get_supported_head_sizes()} only (mla_attention.py:1735-1739)")
        if problem is None and case.mode.value in PREFILL_MODES:
            problem = cls._prefill_problem(case)
        return problem

    @classmethod
    def _prefill_problem(cls, case) -> Optional[str]:
        """Why the case's prefill rows cannot run (no MLA prefill backend takes them), or None."""
        return runtime().mla_prefill(model_of(case))[1]

    def _vllm_layer(self, layer, backend):
        """vLLM's MLAAttention for a kit MLA layer: nope and v widths the rank, the identity
        up-projection, its weights processed as a loaded model's are."""
        ctx, rt = self.ctx, self.rt
        rank, rope, heads = layer.kv_lora_rank, layer.rope_dim, layer.tp_q_head_num
        attn = rt.MLAAttention(
            num_heads=heads, scale=layer.scaling, qk_nope_head_dim=rank, qk_rope_head_dim=rope, v_head_dim=rank,
            q_lora_rank=None, kv_lora_rank=rank, kv_b_proj=_UpProjection(rank, heads, ctx.dtype),
            cache_config=self.vllm_config.cache_config, prefix=layer_name(layer), attn_backend=backend,
            **self._layer_args(layer))
        attn = attn.to(ctx.device)
        attn.process_weights_after_loading(ctx.dtype)
        # After it: with no quantization config it resets every scale to 1.0 (mla_attention.py:1357-1366),
        # where a checkpoint's kv-cache quantization keeps the scales it loaded.
        self._load_kv_scales(attn, layer)
        return attn

    def _layer_args(self, layer) -> dict:
        """MLAAttention's arguments beyond the latent's widths: the prefill backend its prefill rows run."""
        return dict(prefill_backend_cls=self.rt.mla_prefill(model_of(ctx=self.ctx))[0])

    @staticmethod
    def _cache_view(storage: torch.Tensor) -> torch.Tensor:
        """The latent [blocks, block, rank + rope] as vLLM's runner hands it ([blocks, 1, block,
        rank + rope]; MLAAttention.bind_kv_cache drops the head axis), bytes for a quantized cache."""
        view = storage.unsqueeze(1)
        return view.view(torch.uint8) if view.element_size() == 1 else view

    def _call(self, attn, q, k, v, layer):
        """As DeepSeek's attention calls its MLA layer: the query per head, c_kv, k_pe per token."""
        rank = layer.kv_lora_rank
        return attn(q, k[:, 0, :rank], k[:, :, rank:], output_shape=torch.Size((q.shape[0], q.shape[1] * rank)))


class VllmTritonMLABackend(VllmMLABackend):
    """TRITON_MLA (v1/attention/backends/mla/triton_mla.py): vLLM's Triton MLA decode kernels; prefill
    rows through the platform's MLA prefill backend."""

    name = "vllm_triton_mla"
    vllm_backend = "TRITON_MLA"
    triton_kernels = True
    impl_refuses = refusals("TritonMLAImpl", "triton_mla.py:184-188")
    kv_dtypes = ("fp8_e4m3",)  # TritonMLABackend.supported_kv_cache_dtypes
    # A plain CPU run (CI): the smoke set's only width vLLM's MLA takes is DeepSeek's (128 heads of
    # 576), its decode case 20-25 s a run in Triton's interpreter; `--case-set smoke` runs every one.
    ci_cases = {"decode": ("mla_deepseek_h128_bs1_p64_fp16",)}


class VllmFlashMLABackend(VllmMLABackend):
    """FLASHMLA (v1/attention/backends/mla/flashmla.py): DeepSeek's FlashMLA kernels, 64-token
    blocks, its tile scheduler metadata built per batch (persistent buffers under full graphs)."""

    name = "vllm_flashmla"
    vllm_backend = "FLASHMLA"
    cuda_only = True
    impl_refuses = refusals("FlashMLAImpl", "flashmla.py:244-249")
    kv_dtypes = ("fp8_e4m3",)  # FlashMLABackend.supported_kv_cache_dtypes


class VllmFlashAttnMLABackend(VllmMLABackend):
    """FLASH_ATTN_MLA (v1/attention/backends/mla/flashattn_mla.py): FlashAttention 3's MLA decode
    (Hopper)."""

    name = "vllm_flash_attn_mla"
    vllm_backend = "FLASH_ATTN_MLA"
    cuda_only = True
    impl_refuses = refusals("FlashAttnMLAImpl", "flashattn_mla.py:334-339")
