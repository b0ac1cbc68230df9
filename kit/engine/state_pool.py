"""Slot-indexed state pools: what a linear-attention layer keeps per request instead of KV pages.

Per linear layer (NUM_LAYERS, the KV pool's, or a hybrid model's linear layers, by their position among
them: a backend that ignores layer_id reads and writes the wrong layer's state), indexed by a
request's state slot:
  conv      [slots, conv_dim, conv_width - 1]  the conv window, in the model's dtype
  temporal  [slots, Hv, V, K]                  the recurrent state, float32, value rows of key columns
                                               (both engines' layout: fla's GDN and KDA state
                                               [HV, V, K], Mamba2's [H, head_dim, d_state])
and, for speculative verify, per row and draft (SGLang's intermediate caches; the state after
each draft, so that a request keeping n drafts continues from draft n; row i is the verify's
request i, its batch position, as SGLang indexes them):
  intermediate_conv [slots, drafts, conv_dim, conv_width - 1], intermediate_ssm [slots, drafts, Hv, V, K].

Every slot a batch does not own holds poison (reset(), before each batch is installed): large
values, so a state read from a free slot (a new request's, which must start from zeros) moves the
output past tolerance. Each tensor is the head of a buffer TAIL_SLOTS longer, its tail poison the
backend is never handed: a write past the last slot lands there and is seen (kit.harness.state_checks).
Padded rows of a graph batch carry the backend's pad slot (`padded_state_slot`; PADDED_SLOT, -1,
SGLang's PAD_SLOT_ID, by default; vLLM's GDN kernels skip slot 0, its NULL_BLOCK_ID, which no
request here is given): they own nothing.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import torch

from kit.engine.fingerprint import fingerprint
from kit.engine.depth import NUM_LAYERS
from kit.engine.pools import POISON_K_STD, POISON_SEED

PADDED_SLOT = -1
TAIL_SLOTS = 1
POOL_NAMES = ("conv", "temporal", "intermediate_conv", "intermediate_ssm")


@dataclasses.dataclass(frozen=True)
class StateGeometry:
    slots: int
    conv_dim: int
    conv_width: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    drafts: int  # per-draft states kept for verify (0: none)
    spec_columns: int = 0  # conv columns a slot keeps past its window (vLLM's speculative sliding window)
    layers: int = NUM_LAYERS  # the model's linear layers

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        """Each pool's per-slot shape."""
        window = (self.conv_dim, self.conv_width - 1 + self.spec_columns)
        state = (self.num_v_heads, self.head_v_dim, self.head_k_dim)
        return {"conv": window, "temporal": state, "intermediate_conv": (self.drafts,) + window,
                "intermediate_ssm": (self.drafts,) + state}


class StatePool:
    def __init__(self, geometry: StateGeometry, conv_dtype: torch.dtype, device):
        self.geometry, self.size = geometry, geometry.slots
        self.device = torch.device(device)
        dtypes = {"conv": conv_dtype, "temporal": torch.float32, "intermediate_conv": conv_dtype,
                  "intermediate_ssm": torch.float32}
        # [layers, slots + TAIL_SLOTS, ...] each; the backend's views stop at `slots`
        self.buffers = {name: torch.empty((geometry.layers, geometry.slots + TAIL_SLOTS) + shape, dtype=dtypes[name],
                                          device=self.device) for name, shape in geometry.shapes().items()}
        gen = torch.Generator(device=self.device).manual_seed(POISON_SEED)
        for buffer in self.buffers.values():
            buffer.copy_(torch.empty(buffer.shape, device=self.device).normal_(0.0, POISON_K_STD, generator=gen))
        self.poison = {name: b.clone() for name, b in self.buffers.items()}
        self._sealed = fingerprint(self.poison.values())

    def layer(self, name: str, layer_id: int) -> torch.Tensor:
        """One layer's pool `name`, [slots, ...]: what a backend is handed (`layer_id`: the layer's
        position among the linear layers)."""
        return self.buffers[name][layer_id, :self.size]

    # The engines' names for a layer's pools (SGLang's MambaPool layer cache: conv, temporal).
    def conv(self, layer_id: int) -> torch.Tensor:
        return self.layer("conv", layer_id)

    def temporal(self, layer_id: int) -> torch.Tensor:
        return self.layer("temporal", layer_id)

    def intermediate_conv(self, layer_id: int) -> torch.Tensor:
        return self.layer("intermediate_conv", layer_id)

    def intermediate_ssm(self, layer_id: int) -> torch.Tensor:
        return self.layer("intermediate_ssm", layer_id)

    def reset(self) -> None:
        for name, buffer in self.buffers.items():
            buffer.copy_(self.poison[name])

    def sealed_poison(self) -> Tuple[torch.Tensor, List[torch.Tensor], str]:
        """For kit.engine.fingerprint.unchanged, as KVPool's."""
        return self._sealed, list(self.poison.values()), "the state pool's poison"

    def commit(self, slots: torch.Tensor, accepted: torch.Tensor) -> None:
        """After a verify, request i's slot (`slots` [bs]) takes the state and window of its last kept
        draft (`accepted` [bs] >= 1) from intermediate row i, as the engine's scheduler does (SGLang's
        update_mamba_state_after_mtp_verify), in every layer."""
        slots, last = slots.to(torch.int64), accepted.to(torch.int64) - 1
        rows = torch.arange(slots.numel(), device=slots.device)
        for layer_id in range(self.geometry.layers):
            self.temporal(layer_id)[slots] = self.intermediate_ssm(layer_id)[rows, last]
            self.conv(layer_id)[slots] = self.intermediate_conv(layer_id)[rows, last]



@dataclasses.dataclass(frozen=True)
class StateLayout:
    """Where an engine keeps a request's states for a step (its verify rule's, kit.harness.recurrent_rules):
    the slots a request owns (`blocks`: its block-table row, the first its own slot), the conv columns
    each keeps past its window, the drafts of the intermediate pools, and per request the previous
    step's kept tokens the step continues from (None: from the first block, at column 0)."""

    blocks: int = 1
    spec_columns: int = 0
    intermediate_drafts: int = 0
    accepted_before: Optional[Tuple[int, ...]] = None
