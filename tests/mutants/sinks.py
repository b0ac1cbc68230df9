"""Mutants of attention sinks (gpt-oss): each is one bug class of a backend's sink handling, made
by overriding one method of an in-box backend (its source stays untouched). On cases without
sinks they are the plain backend."""
from __future__ import annotations

import dataclasses

import torch

from backends.torch_native import TorchNativeBackend
from backends.triton import TritonBackend


class SinkIgnored(TritonBackend):
    """The layer's sinks are never read: plain softmax, as a backend that drops the model's
    `sinks` argument (or a kernel variant without them picked for the layer) computes."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        return super().forward(q, k, v, dataclasses.replace(layer, sinks=()), batch, save_kv_cache)


class SinkCountedAsValue(TorchNativeBackend):
    """The sink joins the softmax as a key that carries a value, the request's first token's V (a
    learned sink taken for a StreamingLLM sink token): its share of the mass mixes in V[0]
    instead of nothing."""

    def _attend(self, scores, vals, layer):
        if not layer.sinks:
            return super()._attend(scores, vals, layer)
        sinks = layer.sinks_tensor(scores.device).view(-1, 1, 1).expand(scores.shape[:-1] + (1,))
        probs = torch.cat([scores, sinks], dim=-1).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", probs[..., :-1], vals)
        return out + probs[..., -1].transpose(0, 1)[..., None] * vals[0][None]


class SinkFoldedPerSplit(TritonBackend):
    """Split-KV decode folds the sink into every split's partial softmax, not once into their
    combine: a request of n splits counts the sink n times (sink + log n)."""

    def _combine_splits(self, md, out, lse, layer, sinks):
        if sinks is not None:
            b = md.bufs
            splits = torch.arange(b.mid_lse.shape[-1], device=out.device)
            live = (splits[None, :] < b.num_kv_splits[:, None])[:, None, :]  # [rows, 1, splits]
            folded = torch.logaddexp(b.mid_lse, sinks[None, :, None])
            b.mid_o.mul_(torch.where(live, torch.exp(b.mid_lse - folded), 1.0)[..., None])
            b.mid_lse.copy_(torch.where(live, folded, b.mid_lse))
        super()._combine_splits(md, out, lse, layer, None)
