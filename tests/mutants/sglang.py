"""Real-code mutants: known SGLang bugs replayed on SGLang's own source. Each is a
one-line patch of a copy of an sglang module, executed into a fresh module object
(the installed package and its entry in sys.modules stay untouched), whose class
the adapter then wraps. Line numbers are sglang 0.5.23's (the adapter's pin); a
patch whose line no longer reads as expected raises, naming it."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import linecache
import sys
import types

from backends.sglang.adapter import SGLangTritonBackend

TRITON = "sglang.srt.layers.attention.triton_backend"


@functools.lru_cache(maxsize=None)
def patched_module(module: str, line: int, old: str, new: str) -> types.ModuleType:
    """A fresh copy of `module` whose line `line` (1-based) is `old` (stripped) and becomes `new`,
    same indentation."""
    import backends.sglang.runtime  # noqa: F401 - sglang's set-up (shims, interpreter) first

    original = importlib.import_module(module)  # imported as it is first: the copy is put back after
    spec = importlib.util.find_spec(module)
    lines = open(spec.origin).read().splitlines(keepends=True)
    got = lines[line - 1]
    if got.strip() != old:
        raise ValueError(f"{spec.origin}:{line} reads {got.strip()!r}, not {old!r}: the mutant is for another sglang")
    lines[line - 1] = got[:len(got) - len(got.lstrip())] + new + "\n"
    filename = f"{spec.origin} (mutant: line {line})"
    linecache.cache[filename] = (0, None, lines, filename)  # tracebacks and inspect show the mutant's line
    copy = types.ModuleType(module)
    copy.__file__, copy.__package__ = spec.origin, spec.parent
    # Registered while it executes (its dataclasses look their module up), then the original back.
    sys.modules[module] = copy
    try:
        exec(compile("".join(lines), filename, "exec"), copy.__dict__)
    finally:
        sys.modules[module] = original
    return copy


class _TritonMutant(SGLangTritonBackend):
    """TritonAttnBackend from a copy of triton_backend.py with the line `patch` = (line, old, new)."""

    patch = (0, "", "")

    def _impl_class(self):
        return patched_module(TRITON, *self.patch).TritonAttnBackend


class ReplayBsFromBuffer(_TritonMutant):
    """The replay hook takes bs from the length of the req_pool_indices it is handed
    (SGLang PR 26134's review): right for the decode runner's views sliced to bs, wrong
    for the full-capacity buffers the draft-extend runner hands over."""

    patch = (759, "bs = forward_batch.batch_size", "bs = len(forward_batch.req_pool_indices)")


class DraftExtendCountsDraftsTwice(_TritonMutant):
    """The DRAFT_EXTEND_V2 graph metadata takes seq_lens as the prefix, though seq_lens
    already count the drafts (SGLang PR 26651): the drafts are attended twice, once
    from the pool."""

    patch = (725, "kv_lens = torch.clamp(seq_lens - extend_seq_lens, min=0).to(torch.int32)",
             "kv_lens = torch.clamp(seq_lens, min=0).to(torch.int32)")


class VerifyMaskNotRefreshed(_TritonMutant):
    """The TARGET_VERIFY custom mask is copied into the graph's mask buffer at the first
    capture only, not before every replay: replays attend with the capture's all-ones mask."""

    patch = (637, "if spec_info is not None and spec_info.custom_mask is not None:",
             "if spec_info is not None and spec_info.custom_mask is not None and self.forward_metadata is None:")


class ReplayWritesFreshKvIndptr(_TritonMutant):
    """kv_indptr is written into a fresh tensor instead of the backend's buffer: right
    eagerly (the fresh tensor is used), while a graph keeps reading the buffer it
    captured, never filled."""

    patch = (525, "kv_indptr = self.kv_indptr[: bs + 1]",
             "kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)")


class DraftExtendNoClamp(_TritonMutant):
    """The DRAFT_EXTEND_V2 graph prefix seq_lens - drafts without the clamp at 0: a padded
    row (seq_len = fill value 1) gets a negative KV length."""

    patch = (725, "kv_lens = torch.clamp(seq_lens - extend_seq_lens, min=0).to(torch.int32)",
             "kv_lens = (seq_lens - extend_seq_lens).to(torch.int32)")
