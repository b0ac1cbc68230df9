"""What an MLA (DeepSeek-style latent attention) model gives SGLang's attention backends, over the
kit's objects (README "Testing SGLang's backends", MLA):
- `MLAModelConfig`: the ModelConfig fields SGLang derives for an MLA architecture
  (configs/model_config.py:1390-1417) from the kit's layer;
- `mla_pool(pool, layer, sg)`: the kit's latent pool behind SGLang's own MLATokenToKVPool code.
  Its readers (the latent row as key, its first kv_lora_rank columns as value) and both of its
  writers (`set_kv_buffer`: the whole 576-wide row; `set_mla_kv_buffer`: k_nope and k_rope parts)
  are SGLang's functions, run over the kit's buffers: a bug in them is in scope, and the kit
  still checks every byte they write;
- `absorbed_call`: the absorbed attention call SGLang's DeepSeek model makes, per backend
  (models/deepseek_common/attention_forward_methods/forward_mla.py forward_absorb_core).
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch

from kit.modes import ForwardMode

# What SGLang's MLATokenToKVPool does itself, taken from its class (and KVCache's): the methods
# the attention backends call and the ones they call in turn, plus the class-level flags they read.
POOL_CODE = ("get_key_buffer", "get_value_buffer", "get_kv_buffer", "set_kv_buffer", "set_mla_kv_buffer",
             "get_mla_kv_buffer", "_write_mla_kv_buffer", "_scatter_mla_rows", "_write_loc_dcp_span",
             "_check_physical_write_loc", "write_loc_is_dcp_resolved", "dcp_replicated",
             "requires_physical_write_loc")

# The backends the model hands q/k split into their latent and rope parts (q_rope=, k_rope=):
# models/deepseek_common/utils.py FORWARD_ABSORB_CORE_ATTENTION_BACKENDS. The others get the
# parts concatenated, v the latent (forward_mla.py:785-797).
SPLIT_CALL_BACKENDS = ("flashinfer", "fa3", "fa4", "dsa", "trtllm_mla", "cutedsl_mla")

# qk_nope_head_dim and v_head_dim of the model's normal (decompressed, dense) path: DeepSeek-V2/V3's
# 128. Read by SGLang only for that path's ragged prefill, which the kit's absorbed calls never run.
NORMAL_PATH_HEAD_DIM = 128
# ModelConfig's head_dim for every MLA architecture (model_config.py:1396); TritonAttnBackend sizes
# its extend tiles from it (triton_backend.py:416).
MLA_CONFIG_HEAD_DIM = 256


def mla_config(config, layer, sg) -> None:
    """Turn a dense ModelConfig stand-in into the one SGLang derives for an MLA model."""
    config.attention_arch = sg.AttentionArch.MLA
    # DeepSeek's config.json has num_key_value_heads == num_attention_heads (the normal path's
    # heads); SGLang's ModelConfig passes it on, and TritonAttnBackend plans its decode splits by it.
    config.num_key_value_heads = layer.tp_q_head_num
    config.kv_lora_rank, config.qk_rope_head_dim = layer.kv_lora_rank, layer.rope_dim
    config.qk_nope_head_dim = config.v_head_dim = config.swa_v_head_dim = NORMAL_PATH_HEAD_DIM
    config.head_dim = MLA_CONFIG_HEAD_DIM
    # SGLang's ModelConfig computes the MLA softmax scale (qk_nope + rope)^-0.5, times a YaRN
    # factor (model_config.py:1613); the kit's layer carries the case's, which the model's
    # RadixAttention gets too. FlashInferMLAAttnBackend plans with this one, not the layer's.
    config.scaling = layer.scaling


class _MLAPoolState:
    """The state SGLang's MLATokenToKVPool code reads, over the kit's latent pool."""

    start_layer = 0
    layer_transfer_counter = None  # no layer-wise host-to-device transfer in flight
    use_dsa = dsa_kv_cache_store_fp8 = False

    def __init__(self, pool, layer):
        # SGLang's pool holds size + page_size rows (memory_pool.py:4830): the first page is padding.
        self.size, self.page_size = pool.size - pool.page_size, pool.page_size
        # A quantized (fp8) latent is stored as bytes, viewed as the fp8 dtype (memory_pool.py:2029)
        self.dtype, self.store_dtype = pool.dtype, torch.uint8 if pool.quantized else pool.dtype
        self.device = pool.device
        self.kv_lora_rank, self.qk_rope_head_dim = layer.kv_lora_rank, layer.rope_dim
        self.kv_cache_dim = layer.kv_lora_rank + layer.rope_dim  # unquantized (memory_pool.py MLATokenToKVPool)
        # per layer the latent row [slots, 1, rank + rope]
        self.kv_buffer = [b.view(torch.uint8) for b in pool.k_buffer] if pool.quantized else pool.k_buffer
        self.layer_num = len(self.kv_buffer)


def pool_class(sglang_pool):
    """A class with SGLang's MLATokenToKVPool code (POOL_CODE, taken from `sglang_pool`) over
    `_MLAPoolState`."""
    code = {name: inspect.getattr_static(sglang_pool, name) for name in POOL_CODE}
    return type("MLAKVPool", (_MLAPoolState,), code)


# The latent widths (rank + rope) whose rope part SGLang's Triton grouped decode kernel tiles on
# its own (decode_attention.py:826-835): DeepSeek's 512 + 64 and 256 + 32.
TRITON_DECODE_ROPE_SPLIT_WIDTHS = (576, 288)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def triton_decode_width_problem(case) -> Optional[str]:
    """Why TritonAttnBackend cannot decode this MLA case's latent width, or None. Other widths
    tile the whole row as one block of next_pow2(rank + rope) against a value block of
    next_pow2(rank); the two must agree or the kernel does not compile."""
    decodes = case.mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE)
    if not case.is_mla or not decodes or case.head_dim in TRITON_DECODE_ROPE_SPLIT_WIDTHS:
        return None
    if _pow2_at_least(case.head_dim) == _pow2_at_least(case.kv_lora_rank):
        return None
    return (f"MLA width {case.kv_lora_rank} + {case.rope_dim} in {case.mode.name}: SGLang's Triton grouped decode kernel "
            f"splits the rope part off for widths {' and '.join(map(str, TRITON_DECODE_ROPE_SPLIT_WIDTHS))} only "
            f"(decode_attention.py:826); other widths need next_pow2(rank + rope) == next_pow2(rank), or its "
            f"key and value tiles disagree")


def absorbed_call(server_name: str, q, k, v, rank: int):
    """(q, k, v, kwargs) for RadixAttention as the DeepSeek model calls its `attn_mqa` with backend
    `server_name`: q [T, H, rank + rope] (q_nope absorbed | q_pe), k [T, 1, rank + rope] (latent |
    k_pe), v [T, 1, rank] (the latent)."""
    if server_name in SPLIT_CALL_BACKENDS:
        return q[..., :rank], k[..., :rank], k[..., :rank], dict(q_rope=q[..., rank:], k_rope=k[..., rank:])
    return q, k, v, {}
