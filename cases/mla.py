"""MLA case fields shared by the mode files (not a mode: the catalog loads cases/<mode>.py only)."""
from kit.engine.case import DEEPSEEK_RANK, DEEPSEEK_ROPE, DEEPSEEK_SCALE


def deepseek(heads: int) -> dict:
    """DeepSeek-V2/V3's latent attention: rank 512 + rope 64, the scale of its 192-wide q·k
    (a backend deriving it from the 576-wide latent is wrong by a factor of sqrt(3))."""
    return dict(heads=(heads, 1), head_dim=DEEPSEEK_RANK + DEEPSEEK_ROPE, kv_lora_rank=DEEPSEEK_RANK,
                rope_dim=DEEPSEEK_ROPE, scale=DEEPSEEK_SCALE)


# A small latent for the CPU; its scale is not 48 ** -0.5 either.
SMALL_MLA = dict(heads=(16, 1), head_dim=48, kv_lora_rank=32, rope_dim=16, scale=0.1)

# Sparse MLA (DeepSeek-V3.2's DSA): the latent of MLA, each query attending its indexer's top-k keys.
DEEPSEEK_V32_TOPK = 2048  # the indexer's index_topk


def deepseek_v32(heads: int) -> dict:
    """DeepSeek-V3.2: DeepSeek-V3's latent attention, each query over its indexer's 2048 selected keys."""
    return dict(deepseek(heads), index_topk=DEEPSEEK_V32_TOPK)


# For the CPU: a top-k below most smoke contexts and above the shortest (a request's first queries see fewer).
SMALL_SPARSE_MLA = dict(SMALL_MLA, index_topk=12)
