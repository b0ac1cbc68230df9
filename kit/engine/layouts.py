"""How a batch's pages are placed in the KV pool (SPEC layouts).

Every layout keeps the paged invariant: logical token t of a request lives at
slot page_ids[t // P] * P + t % P. Page 0 (which holds scratch slot 0) is never
given to a request. Unowned pages lie between requests (contiguous, shuffled)
and after the batch (every layout); with req_to_token entries past each
request's end pointing at them, a kernel reading past its data reads poison.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Dict, List, Sequence, Tuple


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _contiguous(counts: Sequence[int], start: int) -> List[List[int]]:
    pages, cursor = [], start
    for n in counts:
        pages.append(list(range(cursor, cursor + n)))
        cursor += n + 1  # one unowned page between requests
    return pages


def _shuffled(counts: Sequence[int], rng: random.Random) -> List[List[int]]:
    total = sum(counts)
    ids = rng.sample(range(1, 2 * total + 2), total)
    pages, i = [], 0
    for n in counts:
        pages.append(ids[i:i + n])
        i += n
    return pages


def _interleaved(counts: Sequence[int]) -> List[List[int]]:
    pages: List[List[int]] = [[] for _ in counts]
    cursor = 1
    for j in range(max(counts, default=0)):
        for r, n in enumerate(counts):
            if j < n:
                pages[r].append(cursor)
                cursor += 1
    return pages


def _non_monotonic(old_new: Sequence[Tuple[int, int]], page: int, rng: random.Random) -> List[List[int]]:
    """Pages holding only new tokens come from a low block, permuted per request,
    below the pages holding prefix tokens (page size 1: the new tokens' slots)."""
    old_counts, new_counts = [], []
    for n_old, n_new in old_new:
        total_pages = _ceil_div(n_old + n_new, page)
        old_pages = _ceil_div(n_old, page)
        old_counts.append(old_pages)
        new_counts.append(total_pages - old_pages)
    cursor, new_pages = 1, []
    for n in new_counts:
        ids = list(range(cursor, cursor + n))
        rng.shuffle(ids)
        if n >= 2 and ids == sorted(ids):
            ids.reverse()
        new_pages.append(ids)
        cursor += n
    old_pages = _contiguous(old_counts, cursor + 1)
    return [o + n for o, n in zip(old_pages, new_pages)]


@dataclasses.dataclass(frozen=True)
class PageLayout:
    """How a batch's pages are placed: its name (Case.layout), the suffix of a case's name in
    that layout (in_every_layout), and the placement: (counts of pages per request, (old, new)
    tokens per request, page size, rng) -> page ids per request."""

    name: str
    suffix: str
    place: Callable[[Sequence[int], Sequence[Tuple[int, int]], int, random.Random], List[List[int]]]


# Every page layout, once; a new one is one more entry.
PAGE_LAYOUTS: Dict[str, PageLayout] = {layout.name: layout for layout in (
    PageLayout("contiguous", "", lambda counts, old_new, page, rng: _contiguous(counts, 1)),
    PageLayout("shuffled_pages", "_shuf", lambda counts, old_new, page, rng: _shuffled(counts, rng)),
    PageLayout("interleaved_pages", "_inter", lambda counts, old_new, page, rng: _interleaved(counts)),
    PageLayout("non_monotonic_extend", "_nonmono", lambda counts, old_new, page, rng: _non_monotonic(old_new, page, rng)),
)}
LAYOUTS = tuple(PAGE_LAYOUTS)


def place_pages(layout: str, page: int, old_new: Sequence[Tuple[int, int]],
                rng: random.Random) -> List[List[int]]:
    """Page ids per request, in logical order. old_new: (tokens already cached, new tokens)."""
    if layout not in PAGE_LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    return PAGE_LAYOUTS[layout].place([_ceil_div(o + n, page) for o, n in old_new], old_new, page, rng)


def slots_of(page_ids: Sequence[int], page: int, num_tokens: int) -> List[int]:
    return [page_ids[t // page] * page + t % page for t in range(num_tokens)]
