"""A graph's static buffers: the fields of a rendered batch its converter lists
(kit.engine.render.STATIC_FIELDS), each allocated once for the graph's largest batch and kept at
one address from capture to every replay, as an engine's graph runner keeps its inputs. A batch is
loaded by copying its rendered fields in and padding them up to the graph's rows with what the
engine's profile puts in a padded row (kit.engine.profile); rows past those keep what earlier
batches left. No field is named here: what a graph holds is the converter's, what a padded row
holds the profile's."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from kit.engine.render import PADDED_SEQ_LEN, PADDED_SLOT, REQUEST, STATIC_FIELDS, StaticField


class StaticBatch:
    def __init__(self, template, profile, padded_seq_len: int, max_requests: int, token_capacity: Optional[int],
                 ragged: bool):
        """Buffers for the fields `template` (a rendered batch of the run) has: per request
        `max_requests` entries; per token `token_capacity` (a token-bucket graph's), or where None
        `max_requests` times the template's tokens per request (a batch-size graph's). `ragged`: a
        token-bucket graph, which holds the ragged batches' request lengths too."""
        pads = {PADDED_SLOT: profile.padded_slot, PADDED_SEQ_LEN: padded_seq_len}
        self.max_requests = max_requests
        self.fields: List[StaticField] = [f for f in STATIC_FIELDS if getattr(template, f.name) is not None
                                          and (ragged or not f.ragged)]
        self.pad = {f.name: pads.get(f.pad, f.pad) if isinstance(f.pad, str) else f.pad for f in self.fields}
        # Per token field, its entries per request (a batch-size graph's requests are uniform).
        self.per_request = {f.name: len(getattr(template, f.name)) // template.batch_size
                            for f in self.fields if f.axis != REQUEST}
        self.buffers: Dict[str, torch.Tensor] = {}
        self.lists: Dict[str, list] = {}
        for f in self.fields:
            value = getattr(template, f.name)
            if isinstance(value, list):
                self.lists[f.name] = []
                continue
            size = max_requests if f.axis == REQUEST else token_capacity or max_requests * self.per_request[f.name]
            self.buffers[f.name] = torch.full((size,) + tuple(value.shape[1:]), self.pad[f.name], dtype=value.dtype,
                                              device=value.device)

    def tokens(self, name: str, requests: int) -> int:
        """Entries of token field `name` in a batch-size graph of `requests` requests."""
        return requests * self.per_request[name]

    def _end(self, f: StaticField, requests: int, tokens: Optional[int]) -> int:
        if f.axis == REQUEST:
            return requests
        return self.tokens(f.name, requests) if tokens is None else tokens

    def fill(self, requests: int, tokens: Optional[int] = None) -> None:
        """Every field padded over a graph's `requests` requests and `tokens` tokens (None: the
        requests' tokens): a capture's batch, which no real request is in."""
        for f in self.fields:
            end = self._end(f, requests, tokens)
            if f.name in self.lists:
                self.lists[f.name] = [self.pad[f.name]] * end
            else:
                self.buffers[f.name][:end].fill_(self.pad[f.name])

    def load(self, batch, requests: int, tokens: Optional[int] = None) -> None:
        """`batch`'s fields copied in, padded up to `requests` requests and `tokens` tokens (None:
        the requests' tokens)."""
        for f in self.fields:
            src, end = getattr(batch, f.name), self._end(f, requests, tokens)
            if f.name in self.lists:
                self.lists[f.name] = list(src) + [self.pad[f.name]] * (end - len(src))
                continue
            buf = self.buffers[f.name]
            buf[:src.shape[0]].copy_(src)
            buf[src.shape[0]:end].fill_(self.pad[f.name])

    def first_tokens(self, batch, n: int) -> dict:
        """The token fields of `batch` cut to its first `n` tokens (a backend that sees only the
        real rows of a padded batch)."""
        return {f.name: getattr(batch, f.name)[:n] for f in self.fields if f.axis != REQUEST}

    def held(self, requests: int, tokens: Optional[int] = None, full: bool = False) -> dict:
        """The fields of a graph batch of `requests` requests and `tokens` tokens (None: the
        requests' tokens), as views of the buffers; `full`: the request fields at full capacity
        (rows past the batch hold what earlier batches left there), as some runners hand them."""
        out = {}
        for f in self.fields:
            if f.name in self.lists:
                out[f.name] = list(self.lists[f.name])
            else:
                end = self.max_requests if full and f.axis == REQUEST else self._end(f, requests, tokens)
                out[f.name] = self.buffers[f.name][:end]
        return out
