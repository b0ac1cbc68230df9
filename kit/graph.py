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
import random
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from kit.batch import ForwardBatch, SpecInfo
from kit.case import Case
from kit.fixture import Fixture
from kit.layer import Layer
from kit.modes import ForwardMode
from kit.nan_fill import nan_filled_allocations
from kit.pools import Pools
from kit.protocol import seq_len_fill_value

BS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = tuple(16 << i for i in range(12))  # 16 .. 32768
CUDA_GRAPH, EMULATED, PIECEWISE_EAGER = "cuda-graph", "emulated", "piecewise-eager"
WARMUP_RUNS = 2


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest graph bucket {buckets[-1]}")


def _variant(case: Case, bs: int, salt: int) -> Case:
    """Same config, other batch size and lengths (cycled from the case, each longer)."""
    rng = random.Random(case.rng_seed(100 + salt))
    n = case.bs
    prefix = tuple(case.prefix[i % n] + rng.randint(1, 2 * case.page + 3) for i in range(bs))
    new = case.new if isinstance(case.new, int) else tuple(case.new[i % n] for i in range(bs))
    return case.with_(name=f"{case.name}~replay{salt}", prefix=prefix, new=new, seed=case.seed + salt)


def replay_schedule(case: Case) -> List[Case]:
    """Batches replayed, in order: a larger bucket first, then the case (smaller after
    larger), then a bs-1 batch, then the case's bucket again with other lengths."""
    bucket = bucket_for(case.bs, BS_BUCKETS)
    larger = [b for b in BS_BUCKETS if b > bucket][:1]
    schedule = [_variant(case, b, 1) for b in larger] + [case]
    if case.bs > 1:
        schedule.append(_variant(case, 1, 2))
    schedule.append(_variant(case, case.bs, 3))
    return schedule


@dataclasses.dataclass
class _Captured:
    batch: ForwardBatch  # the batch object forward() saw at capture (views of static buffers)
    graph: Optional["torch.cuda.CUDAGraph"]
    out: Optional[torch.Tensor]


class _Harness:
    def __init__(self, backend, layer: Layer, pools: Pools, mode: ForwardMode, max_tokens: int):
        self.backend, self.layer, self.pools, self.mode = backend, layer, pools, mode
        kv = pools.token_to_kv_pool
        self.device = kv.device
        self.real = self.device.type == "cuda"
        self.detail = CUDA_GRAPH if self.real else EMULATED
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        zeros = lambda *shape, dtype=kv.dtype: torch.zeros(shape, dtype=dtype, device=self.device)
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

    def prepare(self, fx: Fixture) -> None:
        """Captures what replaying `fx` needs, before the pool is installed for judging."""

    def replay(self, fx: Fixture) -> Tuple[torch.Tensor, torch.Tensor]:
        """(output of the real rows, output of the padded rows)."""
        raise NotImplementedError


class BatchGraphs(_Harness):
    """DECODE, TARGET_VERIFY, DRAFT_EXTEND_V2: one graph per batch-size bucket."""

    def __init__(self, backend, layer, pools, mode, case: Case, max_bs: int):
        self.tokens_per_req = case.new if isinstance(case.new, int) else 1
        super().__init__(backend, layer, pools, mode, max_bs * self.tokens_per_req)
        self.draft, self.topk = case.new, case.topk
        self.fill = seq_len_fill_value(backend)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.full((max_bs,), self.fill, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.full((max_bs,), self.fill, dtype=torch.int32)
        backend.init_cuda_graph_state(max_bs, max_bs * self.tokens_per_req)

    def _spec_info(self, bs: int, real_mask: Optional[torch.Tensor], real_rows: int) -> Optional[SpecInfo]:
        if self.mode is ForwardMode.TARGET_VERIFY:
            pad_block = self.draft * (self.fill + self.draft)  # padded rows attend everything
            pad = torch.ones((bs - real_rows) * pad_block, dtype=torch.bool, device=self.device)
            mask = pad if real_mask is None else torch.cat([real_mask, pad])
            return SpecInfo(draft_token_num=self.draft, topk=self.topk, custom_mask=mask)
        if self.mode is ForwardMode.DRAFT_EXTEND_V2:
            lens = torch.full((bs,), self.draft, dtype=torch.int32, device=self.device)
            return SpecInfo(draft_token_num=self.draft, topk=1, extend_seq_lens_tensor=lens,
                            num_tokens_per_bs=self.draft)
        return None

    def capture(self, bs: int) -> None:
        n = bs * self.tokens_per_req
        self.req_pool_indices[:bs].zero_()
        self.seq_lens[:bs].fill_(self.fill)
        self.seq_lens_cpu[:bs].fill_(self.fill)
        self.out_cache_loc[:n].zero_()
        self.positions[:n].zero_()
        spec_info = self._spec_info(bs, None, 0)
        batch = ForwardBatch(
            forward_mode=self.mode, batch_size=bs, req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs], seq_lens_cpu=self.seq_lens_cpu[:bs],
            seq_lens_sum=self.fill * bs, out_cache_loc=self.out_cache_loc[:n], positions=self.positions[:n],
            req_to_token_pool=self.pools.req_to_token_pool, token_to_kv_pool=self.pools.token_to_kv_pool,
            spec_info=spec_info)
        self.backend.init_forward_metadata_capture_cuda_graph(
            bs, n, self.req_pool_indices[:bs], self.seq_lens[:bs], self.mode, spec_info)
        self._capture(bs, batch, n)

    def capture_buckets(self, fixtures: Sequence[Fixture]) -> None:
        for bs in sorted({bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures}, reverse=True):
            self.capture(bs)

    def replay(self, fx: Fixture) -> torch.Tensor:
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
        spec_info = self._spec_info(pbs, real_mask, bs)
        self.backend.init_forward_metadata_replay_cuda_graph(
            pbs, self.req_pool_indices[:pbs], self.seq_lens[:pbs], b.seq_lens_sum + self.fill * (pbs - bs),
            self.mode, spec_info, self.seq_lens_cpu[:pbs])
        out = self._run(pbs, pbs * self.tokens_per_req)
        return out[:n], out[n:]


class ExtendGraphs(_Harness):
    """EXTEND, piecewise contract: the token axis padded to a token bucket."""

    def __init__(self, backend, layer, pools, max_tokens: int, max_bs: int):
        super().__init__(backend, layer, pools, ForwardMode.EXTEND, bucket_for(max_tokens, TOKEN_BUCKETS))
        self.capturing = bool(getattr(backend, "extend_capture", False))
        if not self.capturing:
            self.detail = PIECEWISE_EAGER
        backend.init_cuda_graph_state(max_bs, self.q.shape[0])

    def _padded_batch(self, fx: Fixture, padded: int) -> ForwardBatch:
        self._load_tokens(fx, padded)
        return dataclasses.replace(fx.batch, out_cache_loc=self.out_cache_loc[:padded],
                                   positions=self.positions[:padded])

    def prepare(self, fx: Fixture) -> None:
        padded = bucket_for(fx.plan.num_tokens, TOKEN_BUCKETS)
        if self.capturing and padded not in self.captured:
            fx.install()
            batch = self._padded_batch(fx, padded)
            self.backend.init_forward_metadata(batch)
            self._capture(padded, batch, padded)

    def replay(self, fx: Fixture) -> torch.Tensor:
        padded = bucket_for(fx.plan.num_tokens, TOKEN_BUCKETS)
        batch = self._padded_batch(fx, padded)
        self.backend.init_forward_metadata(batch)
        if self.capturing:
            out = self._run(padded, padded)
        else:
            out = self._forward(batch, padded)
        return out[:fx.plan.num_tokens], out[fx.plan.num_tokens:]
