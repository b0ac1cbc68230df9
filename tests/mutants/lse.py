"""Mutants of the log-sum-exp a backend returns beside its output (returns_lse): each one bug of how
a kernel keeps it, made by overriding one method of an in-box backend (its source stays untouched).
Their outputs are right: only the judged LSE catches them."""
from __future__ import annotations

import math

import torch

from backends.flashinfer import FlashInferBackend
from backends.torch_native import TorchNativeBackend
from backends.triton import TritonBackend


class LseInLog2(TorchNativeBackend):
    """The LSE handed on in base 2, as a kernel computing with exp2 keeps it (FlashInfer's), the
    conversion to the natural log left out."""

    def _lse(self, scores, layer):
        return super()._lse(scores, layer) / math.log(2)


class TritonLseInLog2(TritonBackend):
    """The Triton kernels' LSE handed on in base 2 (the natural log's times log2(e)), in every
    mode, captured graphs' replays too."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return out, lse / math.log(2)


class FlashInferLseInLog2(FlashInferBackend):
    """FlashInfer's LSE handed on as the library keeps it, in base 2: the conversion to the natural
    log left out, in every mode and under graphs."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        return out, lse / math.log(2)


class LseWithoutSinks(TorchNativeBackend):
    """The sink logits join the output's denominator but not the LSE handed on: a merge of partial
    attentions would then count the sink in no part (or, summed back, in every part)."""

    def _lse(self, scores, layer):
        return torch.logsumexp(scores, dim=-1)

