"""A batch's random q, k and v, drawn per request: a request's tokens have the same keys, values
and queries in any batch, at any position, beside any neighbours (kit.engine.plan.RequestData:
its seed and token count), so that one request can recur, bit for bit, in another batch. Each
request's draws come from a generator of its own, seeded by its seed and the layer (geometry,
dtype, layer id): every token's K and V, then the queries of the tokens after its prefix."""
from __future__ import annotations

import dataclasses
import zlib
from typing import List, Optional, Sequence, Tuple

import torch

from kit.engine.plan import BatchPlan, RequestData


@dataclasses.dataclass
class LayerInputs:
    """One layer's inputs for one step of a batch."""

    q: torch.Tensor  # [num_tokens, Hq, D] new tokens' queries
    k_new: torch.Tensor  # [num_tokens, Hkv, D] new tokens' keys, handed to forward()
    v_new: torch.Tensor  # [num_tokens, Hkv, Dv]; MLA: a view of k_new (the latent's first Dv columns)
    k_old: torch.Tensor  # [sum n_old, Hkv, D] cached tokens' keys, in request order
    v_old: torch.Tensor

    @property
    def v_in_k(self) -> bool:
        """V is a view of K's leading columns (MLA's latent), not a tensor of its own."""
        return self.v_new.untyped_storage().data_ptr() == self.k_new.untyped_storage().data_ptr()

    def owned(self) -> List[torch.Tensor]:
        """The tensors these inputs hold (V left out where it is a view of K)."""
        return [self.q, self.k_new, self.k_old] + ([] if self.v_in_k else [self.v_new, self.v_old])

    def _with_v(self, q: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor]):
        return q, k, (k[..., :self.v_new.shape[-1]] if self.v_in_k else v)

    def named(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> List[Tuple[str, torch.Tensor]]:
        """(name, tensor) of what holds each input (V left out where it is a view of K)."""
        return [("q", q), ("k", k)] + ([] if self.v_in_k else [("v", v)])

    def _storage(self, rows: int, form: str, new) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) of `rows` tokens in `form` (kit.engine.case.INPUT_FORMS), from `new(like, shape)`:
        tensors of their own, or views of one fused QKV row per token, as a model's QKV projection
        hands them (head stride D, token stride the row's width)."""
        if form == "contiguous":
            def own(like):
                return new(like, (rows,) + tuple(like.shape[1:]))
            return self._with_v(own(self.q), own(self.k_new), None if self.v_in_k else own(self.v_new))
        if form != "fused_qkv" or self.v_in_k:
            raise ValueError(f"no {form!r} form for these inputs")
        parts = (self.q, self.k_new, self.v_new)
        widths = [x.shape[1] * x.shape[2] for x in parts]
        row = new(self.q, (rows, sum(widths)))
        views, start = [], 0
        for x, width in zip(parts, widths):
            views.append(row[:, start:start + width].unflatten(1, tuple(x.shape[1:])))
            start += width
        return tuple(views)

    def handed(self, form: str = "contiguous") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copies of (q, k, v) for forward(), in `form`: the inputs are shared with other runs of
        the batch, and each run judges whether forward() left its copies as they were. V stays a
        view of K where it is one."""
        copies = self._storage(self.q.shape[0], form, lambda like, shape: like.new_empty(shape))
        for (_, copy), (_, x) in zip(self.named(*copies), self.named(self.q, self.k_new, self.v_new)):
            copy.copy_(x)
        return copies

    def buffers(self, rows: int, form: str = "contiguous") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Zeroed (q, k, v) of `rows` tokens shaped as these, in `form` (a graph's static inputs),
        V a view of K where it is one."""
        return self._storage(rows, form, lambda like, shape: like.new_zeros(shape))


@dataclasses.dataclass
class Stream:
    """One request's draws for one layer: every token's K and V, the queries of its tokens past
    the prefix (V a view of K's leading columns where the layer's latent is one)."""

    k: torch.Tensor  # [n_tokens, Hkv, D]
    v: torch.Tensor  # [n_tokens, Hkv, Dv]
    q: torch.Tensor  # [n_tokens - n_prefix, Hq, D]


def _seed(data: RequestData, layer, dtype: torch.dtype) -> int:
    model = (layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim, layer.v_head_dim, str(dtype), layer.layer_id)
    return zlib.crc32(f"request/{data.seed}/{model}".encode())


def stream(data: RequestData, layer, dtype: torch.dtype, device) -> Stream:
    """The request's draws for `layer` (never constant; the same wherever the request is)."""
    gen = torch.Generator(device=device).manual_seed(_seed(data, layer, dtype))

    def randn(n, heads):
        return torch.randn((n, heads, layer.head_dim), generator=gen, device=device).to(dtype)

    k = randn(data.n_tokens, layer.tp_k_head_num)
    v = k[..., :layer.v_head_dim] if layer.is_mla else randn(data.n_tokens, layer.tp_k_head_num)
    return Stream(k, v, randn(data.n_tokens - data.n_prefix, layer.tp_q_head_num))


def streams(plan: BatchPlan, layers: Sequence, dtype: torch.dtype, device) -> List[List[Stream]]:
    """Per layer, per request of the plan's data: the request's draws."""
    return [[stream(data, layer, dtype, device) for data in plan.data] for layer in layers]


def gather(plan: BatchPlan, drawn: Sequence[Stream]) -> LayerInputs:
    """One layer's inputs for the requests of `plan` (one step), from their requests' draws:
    each request's keys in order (cached, then new) and its new tokens' queries."""
    q, k_new, v_new, k_old, v_old = [], [], [], [], []
    for r in plan.requests:
        s, data = drawn[r.request], plan.data[r.request]
        keys = r.key_tokens
        old, new = keys[:r.n_old], keys[r.n_old:]
        k_old.append(_rows(s.k, old))
        k_new.append(_rows(s.k, new))
        q.append(_rows(s.q, [t - data.n_prefix for t in new]))
        if s.v.untyped_storage().data_ptr() != s.k.untyped_storage().data_ptr():
            v_old.append(_rows(s.v, old))
            v_new.append(_rows(s.v, new))
    k_new_all, k_old_all = torch.cat(k_new), torch.cat(k_old)
    v_width = drawn[0].v.shape[-1]
    if v_new:
        v_new_all, v_old_all = torch.cat(v_new), torch.cat(v_old)
    else:  # MLA: V is the latent's leading columns, a view
        v_new_all, v_old_all = k_new_all[..., :v_width], k_old_all[..., :v_width]
    return LayerInputs(q=torch.cat(q), k_new=k_new_all, v_new=v_new_all, k_old=k_old_all, v_old=v_old_all)


def _rows(x: torch.Tensor, tokens: List[int]) -> torch.Tensor:
    """x's rows `tokens`: a slice where they are consecutive (no index tensor, no copy)."""
    if not tokens:
        return x[:0]
    if tokens == list(range(tokens[0], tokens[0] + len(tokens))):
        return x[tokens[0]:tokens[0] + len(tokens)]
    return x[torch.tensor(tokens, device=x.device)]
