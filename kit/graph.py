"""The graph harness: the production capture/replay contract (SPEC "Execution").

DECODE / TARGET_VERIFY / DRAFT_EXTEND_V2: static buffers sized for the largest
bucket, one graph captured per batch-size bucket (warm-up on a side stream
first), then replays in mixed order with padded rows set by the fill rules.
EXTEND (piecewise contract): the token axis is padded to a token bucket;
padded tokens write KV to slot 0; metadata comes from the real batch.
Without CUDA the same hooks, buffers, padding and order run without a graph
("emulated").
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from kit.batch import ForwardBatch
from kit.fixture import Fixture
from kit.layer import Layer
from kit.modes.rules import BATCH_SIZE_GRAPHS, TOKEN_COUNT_GRAPHS
from kit.nan_fill import nan_filled_allocations
from kit.protocol import seq_len_fill_value
from kit.record import CUDA_GRAPH, EMULATED, PIECEWISE_EAGER
from kit.schedule import BS_BUCKETS, TOKEN_BUCKETS, bucket_for

WARMUP_RUNS = 2


@dataclasses.dataclass
class _Captured:
    batch: ForwardBatch  # the batch object forward() saw at capture (views of static buffers)
    graph: Optional["torch.cuda.CUDAGraph"]
    out: Optional[torch.Tensor]


class _Harness:
    """Static buffers, captures and replays for one run's fixtures (one pool, one layer)."""

    def __init__(self, backend, layer: Layer, fixtures: Sequence[Fixture], max_tokens: int):
        self.backend, self.layer = backend, layer
        self.pools = fixtures[0].pools
        self.case = fixtures[0].case
        self.mode = self.case.mode
        self.max_bs = max(bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures)
        kv = self.pools.token_to_kv_pool
        self.device = kv.device
        self.real = self.device.type == "cuda"
        self.detail = CUDA_GRAPH if self.real else EMULATED
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        zeros = lambda *shape, dtype=kv.dtype: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
        self.q, self.k, self.v = zeros(max_tokens, hq, d), zeros(max_tokens, hkv, d), zeros(max_tokens, hkv, d)
        self.out_cache_loc = zeros(max_tokens, dtype=torch.int64)
        self.positions = zeros(max_tokens, dtype=torch.int64)
        self.captured: Dict[int, _Captured] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.real else None

    def _forward(self, batch: ForwardBatch, n: int) -> torch.Tensor:
        with nan_filled_allocations():
            return self.backend.forward(self.q[:n], self.k[:n], self.v[:n], self.layer, batch)

    def _capture(self, key: int, batch: ForwardBatch, n: int) -> None:
        if not self.real:
            self._forward(batch, n)  # capture-time output is discarded
            self.captured[key] = _Captured(batch, None, None)
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._forward(batch, n)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self._forward(batch, n)
        self.captured[key] = _Captured(batch, graph, out)

    def _run(self, key: int, n: int) -> torch.Tensor:
        cap = self.captured[key]
        if self.real:
            cap.graph.replay()
            return cap.out
        return self._forward(cap.batch, n)

    def _load_tokens(self, fx: Fixture, padded: int) -> int:
        """Real tokens copied in; padded tokens write slot 0 at position 0."""
        n = fx.plan.num_tokens
        for buf, src in ((self.q, fx.q), (self.k, fx.k_new), (self.v, fx.v_new),
                         (self.out_cache_loc, fx.batch.out_cache_loc), (self.positions, fx.batch.positions)):
            buf[:n].copy_(src)
            buf[n:padded].zero_()
        return n

    def capture(self) -> None:
        """Captures every graph that does not need a real batch, before any replay."""

    def prepare(self, fx: Fixture) -> None:
        """Captures what replaying `fx` needs (the pool is installed for judging after this)."""

    def replay(self, fx: Fixture) -> Tuple[torch.Tensor, torch.Tensor]:
        """(output of the real rows, output of the padded rows)."""
        raise NotImplementedError

    def describe(self, i: int, fixtures: List[Fixture]) -> str:
        """Which replay of the run, for messages."""
        bs = fixtures[i].batch.batch_size
        text = f"replay {i + 1}/{len(fixtures)} (bs={bs}{self._where(fixtures[i])}"
        if i:
            text += f", after bs={fixtures[i - 1].batch.batch_size}"
        return text + ")"

    def _where(self, fx: Fixture) -> str:
        raise NotImplementedError


class BatchGraphs(_Harness):
    """One graph per batch-size bucket, a fixed number of tokens per request (DECODE,
    TARGET_VERIFY, DRAFT_EXTEND_V2)."""

    def __init__(self, backend, layer, fixtures: Sequence[Fixture]):
        case = fixtures[0].case
        self.rules = case.mode.rules
        self.tokens_per_req = self.rules.tokens_per_request(case)
        max_bs = max(bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures)
        super().__init__(backend, layer, fixtures, max_bs * self.tokens_per_req)
        self.fill = seq_len_fill_value(backend)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.full((max_bs,), self.fill, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.full((max_bs,), self.fill, dtype=torch.int32)
        self.buckets = sorted({bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures}, reverse=True)
        backend.init_cuda_graph_state(max_bs, max_bs * self.tokens_per_req)

    def _spec_info(self, bs: int, real_rows: int, real_mask: Optional[torch.Tensor]):
        return self.rules.spec_info(self.case, bs, real_rows, real_mask, self.fill, self.device)

    def capture_bucket(self, bs: int) -> None:
        n = bs * self.tokens_per_req
        self.req_pool_indices[:bs].zero_()
        self.seq_lens[:bs].fill_(self.fill)
        self.seq_lens_cpu[:bs].fill_(self.fill)
        self.out_cache_loc[:n].zero_()
        self.positions[:n].zero_()
        spec_info = self._spec_info(bs, 0, None)
        batch = ForwardBatch(
            forward_mode=self.mode, batch_size=bs, req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs], seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=self.fill * bs, out_cache_loc=self.out_cache_loc[:n], positions=self.positions[:n],
            req_to_token_pool=self.pools.req_to_token_pool, token_to_kv_pool=self.pools.token_to_kv_pool,
            spec_info=spec_info)
        self.backend.init_forward_metadata_capture_cuda_graph(
            bs, n, self.req_pool_indices[:bs], self.seq_lens[:bs], self.mode, spec_info)
        self._capture(bs, batch, n)

    def capture(self) -> None:
        for bs in self.buckets:  # largest first, as engines capture
            self.capture_bucket(bs)

    def replay(self, fx: Fixture) -> Tuple[torch.Tensor, torch.Tensor]:
        b = fx.batch
        bs = b.batch_size
        pbs = bucket_for(bs, BS_BUCKETS)
        self.req_pool_indices[:bs].copy_(b.req_pool_indices)
        self.req_pool_indices[bs:pbs].zero_()
        self.seq_lens[:bs].copy_(b.seq_lens)
        self.seq_lens[bs:pbs].fill_(self.fill)
        self.seq_lens_cpu[:bs].copy_(b.seq_lens_cpu)
        self.seq_lens_cpu[bs:pbs].fill_(self.fill)
        n = self._load_tokens(fx, pbs * self.tokens_per_req)
        real_mask = b.spec_info.custom_mask if b.spec_info is not None else None
        spec_info = self._spec_info(pbs, bs, real_mask)
        self.backend.init_forward_metadata_replay_cuda_graph(
            pbs, self.req_pool_indices[:pbs], self.seq_lens[:pbs], b.seq_lens_sum + self.fill * (pbs - bs),
            self.mode, spec_info, self.seq_lens_cpu[:pbs])
        out = self._run(pbs, pbs * self.tokens_per_req)
        return out[:n], out[n:]

    def _where(self, fx: Fixture) -> str:
        return f" in bucket {bucket_for(fx.batch.batch_size, BS_BUCKETS)}"


class ExtendGraphs(_Harness):
    """The piecewise contract: the token axis padded to a token bucket (EXTEND)."""

    def __init__(self, backend, layer, fixtures: Sequence[Fixture]):
        max_tokens = max(fx.plan.num_tokens for fx in fixtures)
        super().__init__(backend, layer, fixtures, bucket_for(max_tokens, TOKEN_BUCKETS))
        self.capturing = bool(getattr(backend, "extend_capture", False))
        if not self.capturing:
            self.detail = PIECEWISE_EAGER
        backend.init_cuda_graph_state(self.max_bs, self.q.shape[0])

    def _padded_batch(self, fx: Fixture, padded: int) -> ForwardBatch:
        self._load_tokens(fx, padded)
        return dataclasses.replace(fx.batch, out_cache_loc=self.out_cache_loc[:padded],
                                   positions=self.positions[:padded])

    def prepare(self, fx: Fixture) -> None:
        padded = bucket_for(fx.plan.num_tokens, TOKEN_BUCKETS)
        if self.capturing and padded not in self.captured:
            batch = self._padded_batch(fx, padded)
            self.backend.init_forward_metadata(batch)
            self._capture(padded, batch, padded)

    def replay(self, fx: Fixture) -> Tuple[torch.Tensor, torch.Tensor]:
        padded = bucket_for(fx.plan.num_tokens, TOKEN_BUCKETS)
        batch = self._padded_batch(fx, padded)
        self.backend.init_forward_metadata(batch)
        if self.capturing:
            out = self._run(padded, padded)
        else:
            out = self._forward(batch, padded)
        return out[:fx.plan.num_tokens], out[fx.plan.num_tokens:]

    def _where(self, fx: Fixture) -> str:
        return f", {fx.plan.num_tokens} tokens"


HARNESSES = {BATCH_SIZE_GRAPHS: BatchGraphs, TOKEN_COUNT_GRAPHS: ExtendGraphs}


def harness_for(backend, layer: Layer, fixtures: Sequence[Fixture]) -> _Harness:
    """The harness of the fixtures' mode's graph contract (it sets up the backend's graph state)."""
    return HARNESSES[fixtures[0].case.mode.rules.graph](backend, layer, fixtures)
