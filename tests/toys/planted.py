"""Planted bugs that no case of the catalog reaches, for the fuzzer to find (tests/test_fuzz.py)."""
from __future__ import annotations

import dataclasses
from typing import Sequence

from backends.torch_native import TorchNativeBackend
from backends.torch_native_linear import TorchNativeLinearBackend
from kit.engine.kinds.recurrent import CHUNK
from kit.modes import ForwardMode


def triggered(prefix: Sequence[int], page: int) -> bool:
    """The bug's condition on a DECODE batch: a request with nothing cached right before one whose
    cached tokens fill whole pages (page > 1)."""
    return page > 1 and any(a == 0 and b > 0 and b % page == 0 for a, b in zip(prefix, prefix[1:]))


class ZeroRowBeforeFullPage(TorchNativeBackend):
    """DECODE: a request whose cached tokens fill its pages exactly, right after a request with
    nothing cached, reads one key short (its own new token): its key count comes from page
    offsets that take the empty request for a page. A zero-length row next to a full page."""

    name = "planted_zero_row_before_full_page"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if batch.forward_mode is ForwardMode.DECODE:
            page = batch.token_to_kv_pool.page_size
            requests = list(batch.step.requests)
            for i in range(1, len(requests)):
                if triggered([r.n_old for r in requests[i - 1:i + 1]], page):
                    short = requests[i].visible.clone()
                    short[:, -1] = False  # the request's own new token, the key past its full pages
                    requests[i] = dataclasses.replace(requests[i], visible=short)
            batch = dataclasses.replace(batch, step=dataclasses.replace(batch.step, requests=requests))
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class WindowOneShort(TorchNativeBackend):
    """A sliding window of W attends W keys (p-W+1..p), not the contract's W+1 (p-W..p): one key fewer,
    whatever else the layer has (tests/test_fuzz.py: the found case drops every other feature)."""

    name = "planted_window_one_short"

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if layer.sliding_window_size > 0:
            layer = dataclasses.replace(layer, sliding_window_size=layer.sliding_window_size - 1)
        return super().forward(q, k, v, layer, batch, save_kv_cache)


class SecondChunkFromSavedState(TorchNativeLinearBackend):
    """A recurrent layer's request of more new tokens than the kernels' chunk runs its second chunk from
    the state the request started the step with, not the state after its first chunk (a chunked scan
    handed each chunk the step's initial state): only rows past the chunk are wrong."""

    name = "planted_second_chunk_from_saved_state"

    def _scan(self, state, update, output, longest):
        start = state
        return super()._scan(state, lambda s, t: update(start if t == CHUNK else s, t), output, longest)
