"""Qwen3-Next's Hugging Face config of a kit GDN layer: what both engines read of a GDN model (vLLM
builds its layer from it; SGLang's model runner holds it as its model config's hf_config)."""
from __future__ import annotations


def qwen3_next_config(layer, config_cls=None):
    """A Qwen3NextConfig (transformers', or the engine's own `config_cls`) of the kit layer's heads,
    head widths, conv width and activation."""
    if config_cls is None:
        from transformers import Qwen3NextConfig as config_cls

    return config_cls(hidden_size=layer.num_v_heads * layer.head_v_dim, linear_num_key_heads=layer.num_k_heads,
                      linear_num_value_heads=layer.num_v_heads, linear_key_head_dim=layer.head_k_dim,
                      linear_value_head_dim=layer.head_v_dim, linear_conv_kernel_dim=layer.conv_weights.shape[1],
                      hidden_act=layer.activation)
