"""The graph harness: the production capture/replay contract (SPEC "Graph mode").

Batch-size graphs (DECODE / TARGET_VERIFY / DRAFT_EXTEND_V2): static buffers
sized for the largest bucket, one graph captured per batch-size bucket (warm-up
on a side stream first), then replays in mixed order with padded rows set by
the fill rules. Token graphs (EXTEND, piecewise contract): the token axis is
padded to a token bucket; padded tokens write KV to slot 0.

The backend's hooks are driven in its own style (kit.harness.capabilities.GraphHooks):
two-phase (out_graph before capture and before every replay, in_graph recorded
in the graph with forward) or capture/replay. Every second replay hands the
backend full-capacity request buffers (rows past the batch hold what earlier
batches left there), as SGLang's draft-extend runner does.

Without CUDA the same hooks, buffers, padding and order run without a graph
("emulated"): forward() runs again at each replay, but with the backend's Python
state put back to what it was at capture (kit.harness.hoststate), as a real graph keeps
its launch arguments; a tensor the replay hooks replaced is named. Allocations
of the hooks and of the captured forward carry canary tails (kit.harness.guard), on GPU
too, so a write past one is seen after each replay.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
from typing import Dict, List, Optional, Sequence

import torch

from kit.engine.batch import ForwardBatch
from kit.engine.fixture import Fixture
from kit.harness.guard import Guard, canary_figures
from kit.harness.hoststate import Bindings, replaced, tensor_pointers
from kit.engine.modes import rules_for
from kit.engine.modes.rules import GraphBuckets
from kit.harness.nan_fill import nan_filled_allocations
from kit.harness.capabilities import Capabilities, GraphHooks
from kit.harness.protocol import seq_len_fill_value
from kit.report.record import CUDA_GRAPH, EMULATED, PIECEWISE_EAGER
from kit.harness.schedule import BS_BUCKETS, TOKEN_BUCKETS, bucket_for
from kit.harness.checks import Handed, Pending, handed_inputs, inputs_figures

WARMUP_RUNS = 2


def full_capacity(i: int) -> bool:
    """Whether replay i (from 0) hands the backend full-capacity request buffers: every second."""
    return i % 2 == 1


@contextlib.contextmanager
def _no_collection():
    """No garbage collection during a capture: collecting an earlier run's graph or stream there
    is a CUDA call the capture forbids, and it fails ("operation failed due to a previous error
    during capture") at whatever op comes next."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

@dataclasses.dataclass
class Replayed:
    outs: List[torch.Tensor]  # per layer, the output of the real rows
    padded: List[torch.Tensor]  # per layer, the output of the padded rows
    replaced: List[str]  # backend attributes holding another tensor than at capture (emulated graphs)
    memory: Pending  # canaries of what the hooks and the captured forward allocated (kit.harness.guard)
    inputs: List[Pending]  # the static inputs kept, at this replay and the captures since the last


@dataclasses.dataclass
class _Captured:
    batch: ForwardBatch  # the batch object the captured step saw (views of static buffers)
    graph: Optional["torch.cuda.CUDAGraph"] = None
    outs: Optional[List[torch.Tensor]] = None
    guard: Optional[Guard] = None  # real graphs: canary tails of what the captured step allocated
    bindings: Optional[Bindings] = None  # emulated: the backend's Python state at capture
    pointers: Dict[str, int] = dataclasses.field(default_factory=dict)


class _Harness:
    """Static buffers, captures and replays for one run's fixtures (one pool, one model)."""

    def __init__(self, backend, caps: Capabilities, fixtures: Sequence[Fixture], max_tokens: int):
        self.backend = backend
        self.caps = caps
        self.layers = fixtures[0].layers
        self.pools = fixtures[0].pools
        self.case = fixtures[0].case
        self.mode = self.case.mode
        self.two_phase = caps.graph_hooks is GraphHooks.TWO_PHASE
        self.max_bs = max(bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures)
        kv = self.pools.token_to_kv_pool
        self.device = kv.device
        self.real = self.device.type == "cuda"
        self.detail = CUDA_GRAPH if self.real else EMULATED
        self.fill = seq_len_fill_value(backend)
        zeros = lambda *shape, dtype=kv.dtype: torch.zeros(shape, dtype=dtype, device=self.device)  # noqa: E731
        # per layer: the token inputs forward() is handed, shaped as the fixture's
        self.max_tokens = max_tokens
        self.inputs = fixtures[0].inputs
        self.q, self.k, self.v = (list(t) for t in zip(*(x.buffers(max_tokens, self.case.inputs)
                                                          for x in self.inputs)))
        self.input_checks: List[Pending] = []  # of captures, judged with the next replay
        self.out_cache_loc = zeros(max_tokens, dtype=torch.int64)
        self.positions = zeros(max_tokens, dtype=torch.int64)
        self.req_pool_indices = zeros(self.max_bs, dtype=torch.int32)
        self.seq_lens = torch.full((self.max_bs,), self.fill, dtype=torch.int32, device=self.device)
        self.seq_lens_cpu = torch.full((self.max_bs,), self.fill, dtype=torch.int32)
        self.captured: Dict[int, _Captured] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.real else None
        self.replays = 0

    def _forward(self, batch: ForwardBatch, n: int) -> List[torch.Tensor]:
        """forward() for every layer of the model, on the same metadata."""
        with nan_filled_allocations():
            return [self.backend.forward(self.q[i][:n], self.k[i][:n], self.v[i][:n], layer, batch)
                    for i, layer in enumerate(self.layers)]

    def _step(self, batch: ForwardBatch, n: int) -> List[torch.Tensor]:
        """What a graph records: the two-phase backend's in-graph metadata, then forward per layer."""
        if self.two_phase and self.caps.in_graph:
            self.backend.init_forward_metadata_in_graph(batch)
        return self._forward(batch, n)

    def _static(self, start: int, end: int) -> List[tuple]:
        """Per layer, rows [start, end) of the static (q, k, v)."""
        return [(q[start:end], k[start:end], v[start:end]) for q, k, v in zip(self.q, self.k, self.v)]

    def _kept(self, fx: Optional[Fixture], n: int, padded: int, where: str = "") -> Pending:
        """The static inputs after a step on `padded` rows, against what the kit loaded: the
        real rows of `fx` (its own inputs, the first n rows), zeros past them."""
        handed = handed_inputs(fx, self._static(0, n), where) if fx is not None else []
        for layer, x, qkv in zip(self.layers, self.inputs, self._static(n, padded)):
            rows = "padded rows" if fx is not None else "zeroed rows"
            handed += [Handed(name, f"layer {layer.layer_id}, {rows}{where}", after, first_row=n)
                       for name, after in x.named(*qkv)]
        return inputs_figures(handed)

    def _capture(self, key: int, batch: ForwardBatch, n: int, fx: Optional[Fixture] = None, real_rows: int = 0) -> None:
        """Captures graph `key` on n rows of the static inputs, which hold `fx`'s first real_rows
        (else zeros)."""
        self._capture_step(key, batch, n)
        self.input_checks.append(self._kept(fx, real_rows, n, f", at the capture of {self._graph_name(key)}"))

    def _capture_step(self, key: int, batch: ForwardBatch, n: int) -> None:
        if not self.real:
            self._step(batch, n)  # capture-time output is discarded
            self.captured[key] = _Captured(batch, bindings=Bindings.of(self.backend),
                                           pointers=tensor_pointers(self.backend))
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._step(batch, n)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph, guard = torch.cuda.CUDAGraph(), Guard()
        # capture_begin/end on a side stream, as torch.cuda.graph does, without its empty_cache():
        # run after run, that handed the cache back and the next batch's allocations went to cudaMalloc.
        with _no_collection(), torch.cuda.stream(side), guard.watching():
            graph.capture_begin(pool=self.mempool)
            try:
                outs = self._step(batch, n)
            finally:
                graph.capture_end()
        self.captured[key] = _Captured(batch, graph, outs, guard)

    def _run(self, key: int, n: int, guard: Guard):
        """Replays graph `key` after its hooks ran (under `guard`): (outs, replaced tensors, memory)."""
        cap = self.captured[key]
        if self.real:
            cap.graph.replay()
            return cap.outs, [], canary_figures(guard, cap.guard)
        swapped = replaced(cap.pointers, tensor_pointers(self.backend))
        after_hooks = Bindings.of(self.backend)
        cap.bindings.restore()
        try:
            with guard.watching():
                outs = self._step(cap.batch, n)
        finally:
            after_hooks.restore()  # forward's own Python side effects do not happen in a real replay
        return outs, swapped, canary_figures(guard)

    def _load_tokens(self, fx: Fixture, padded: int) -> int:
        """Real tokens copied in; padded tokens write slot 0 at position 0."""
        n = fx.plan.num_tokens
        pairs = [(self.out_cache_loc, fx.batch.out_cache_loc), (self.positions, fx.batch.positions)]
        for i, x in enumerate(fx.inputs):
            pairs += [(self.q[i], x.q), (self.k[i], x.k_new), (self.v[i], x.v_new)]
        for buf, src in pairs:
            buf[:n].copy_(src)
            buf[n:padded].zero_()
        return n

    def _requests(self, bs: int, full: bool) -> dict:
        """The request buffers a batch view hands over: exact-size views, or full capacity."""
        end = self.max_bs if full else bs
        return dict(req_pool_indices=self.req_pool_indices[:end], seq_lens=self.seq_lens[:end],
                    seq_lens_cpu=self.seq_lens_cpu[:end])

    def _replayed(self, outs: List[torch.Tensor], fx: Fixture, padded: int, swapped: List[str],
                  memory: Pending) -> Replayed:
        """Real and padded rows of the outputs, per layer; the static inputs judged kept (and
        those of the captures since the last replay)."""
        n = fx.plan.num_tokens
        inputs, self.input_checks = self.input_checks + [self._kept(fx, n, padded)], []
        return Replayed([o[:n] for o in outs], [o[n:] for o in outs], swapped, memory, inputs)

    def _graph_name(self, key: int) -> str:
        raise NotImplementedError

    def capture(self) -> None:
        """Captures every graph that does not need a real batch, before any replay."""

    def prepare(self, fx: Fixture) -> None:
        """Captures what replaying `fx` needs (the pool is installed for judging after this)."""

    def replay(self, fx: Fixture) -> Replayed:
        i, self.replays = self.replays, self.replays + 1
        return self._replay(fx, full_capacity(i))

    def _replay(self, fx: Fixture, full: bool) -> Replayed:
        raise NotImplementedError

    def describe(self, i: int, fixtures: List[Fixture]) -> str:
        """Which replay of the run, for messages."""
        bs = fixtures[i].batch.batch_size
        text = f"replay {i + 1}/{len(fixtures)} (bs={bs}{self._where(fixtures[i])}"
        if i:
            text += f", after bs={fixtures[i - 1].batch.batch_size}"
        if full_capacity(i):
            text += ", full-capacity buffers"
        return text + ")"

    def _where(self, fx: Fixture) -> str:
        raise NotImplementedError


class BatchGraphs(_Harness):
    """One graph per batch-size bucket, a fixed number of tokens per request (DECODE,
    TARGET_VERIFY, DRAFT_EXTEND_V2)."""

    def __init__(self, backend, caps: Capabilities, fixtures: Sequence[Fixture]):
        case = fixtures[0].case
        self.rules = rules_for(case.mode)
        self.tokens_per_req = self.rules.tokens_per_request(case)
        max_bs = max(bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures)
        super().__init__(backend, caps, fixtures, max_bs * self.tokens_per_req)
        self.buckets = sorted({bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures}, reverse=True)
        backend.init_cuda_graph_state(max_bs, max_bs * self.tokens_per_req)

    def _spec_info(self, bs: int, real_rows: int, real_mask: Optional[torch.Tensor]):
        return self.rules.spec_info(self.case, bs, real_rows, real_mask, self.fill, self.device)

    def _view(self, bs: int, seq_lens_sum: int, spec_info, full: bool) -> ForwardBatch:
        n = bs * self.tokens_per_req
        return ForwardBatch(
            forward_mode=self.mode, batch_size=bs, **self._requests(bs, full), seq_lens_sum=seq_lens_sum,
            out_cache_loc=self.out_cache_loc[:n], positions=self.positions[:n],
            req_to_token_pool=self.pools.req_to_token_pool, token_to_kv_pool=self.pools.token_to_kv_pool,
            spec_info=spec_info)

    def capture_bucket(self, bs: int) -> None:
        n = bs * self.tokens_per_req
        self.req_pool_indices[:bs].zero_()
        self.seq_lens[:bs].fill_(self.fill)
        self.seq_lens_cpu[:bs].fill_(self.fill)
        self.out_cache_loc[:n].zero_()
        self.positions[:n].zero_()
        spec_info = self._spec_info(bs, 0, None)
        batch = self._view(bs, self.fill * bs, spec_info, full=False)
        if self.two_phase:
            self.backend.init_forward_metadata_out_graph(batch, in_capture=True)
        else:
            self.backend.init_forward_metadata_capture_cuda_graph(
                bs, n, batch.req_pool_indices, batch.seq_lens, self.mode, spec_info)
        self._capture(bs, batch, n)

    def capture(self) -> None:
        for bs in self.buckets:  # largest first, as engines capture
            self.capture_bucket(bs)

    def _replay(self, fx: Fixture, full: bool) -> Replayed:
        b = fx.batch
        bs = b.batch_size
        pbs = bucket_for(bs, BS_BUCKETS)
        # Rows past pbs keep what earlier batches left: a full-capacity view shows them.
        self.req_pool_indices[:bs].copy_(b.req_pool_indices)
        self.req_pool_indices[bs:pbs].zero_()
        self.seq_lens[:bs].copy_(b.seq_lens)
        self.seq_lens[bs:pbs].fill_(self.fill)
        self.seq_lens_cpu[:bs].copy_(b.seq_lens_cpu)
        self.seq_lens_cpu[bs:pbs].fill_(self.fill)
        self._load_tokens(fx, pbs * self.tokens_per_req)
        real_mask = b.spec_info.custom_mask if b.spec_info is not None else None
        spec_info = self._spec_info(pbs, bs, real_mask)
        view = self._view(pbs, b.seq_lens_sum + self.fill * (pbs - bs), spec_info, full)
        guard = Guard()
        with guard.watching():
            if self.two_phase:
                self.backend.init_forward_metadata_out_graph(view)
            else:
                self.backend.init_forward_metadata_replay_cuda_graph(
                    pbs, view.req_pool_indices, view.seq_lens, view.seq_lens_sum, self.mode, spec_info,
                    view.seq_lens_cpu)
        outs, swapped, memory = self._run(pbs, pbs * self.tokens_per_req, guard)
        return self._replayed(outs, fx, pbs * self.tokens_per_req, swapped, memory)

    def _where(self, fx: Fixture) -> str:
        return f" in bucket {bucket_for(fx.batch.batch_size, BS_BUCKETS)}"

    def _graph_name(self, key: int) -> str:
        return f"bucket {key}"


class ExtendGraphs(_Harness):
    """The piecewise contract: the token axis padded to a token bucket (EXTEND); one graph per
    token bucket, replayed with any batch whose tokens fit it, whatever its request count."""

    EXTEND_FIELDS = ("extend_seq_lens", "extend_prefix_lens", "extend_start_loc")

    def __init__(self, backend, caps: Capabilities, fixtures: Sequence[Fixture]):
        max_tokens = max(fx.plan.num_tokens for fx in fixtures)
        super().__init__(backend, caps, fixtures, bucket_for(max_tokens, TOKEN_BUCKETS))
        self.real_rows_only = caps.real_rows_only
        # A backend that sees only the real rows cannot have them captured: their count varies.
        self.capturing = caps.extend_capture and not self.real_rows_only
        if not self.capturing:
            self.detail = PIECEWISE_EAGER
        self.extend = {f: torch.zeros(self.max_bs, dtype=torch.int32, device=self.device) for f in self.EXTEND_FIELDS}
        backend.init_cuda_graph_state(self.max_bs, self.max_tokens)

    def _view(self, fx: Fixture, padded: int, full: bool) -> ForwardBatch:
        """The batch over the static buffers: its requests copied in (rows past it keep what
        earlier batches left), its tokens padded to the bucket."""
        b = fx.batch
        bs = b.batch_size
        self._load_tokens(fx, padded)
        for buf, src in ((self.req_pool_indices, b.req_pool_indices), (self.seq_lens, b.seq_lens),
                         (self.seq_lens_cpu, b.seq_lens_cpu)):
            buf[:bs].copy_(src)
        end = self.max_bs if full else bs
        for f, buf in self.extend.items():
            buf[:bs].copy_(getattr(b, f))
        return dataclasses.replace(
            b, **self._requests(bs, full), **{f: buf[:end] for f, buf in self.extend.items()},
            out_cache_loc=self.out_cache_loc[:padded], positions=self.positions[:padded])

    def _metadata(self, batch: ForwardBatch, in_capture: bool = False) -> None:
        if self.two_phase:
            self.backend.init_forward_metadata_out_graph(batch, in_capture=in_capture)
        else:
            self.backend.init_forward_metadata(batch)

    def prepare(self, fx: Fixture) -> None:
        padded = bucket_for(fx.plan.num_tokens, TOKEN_BUCKETS)
        if self.capturing and padded not in self.captured:
            batch = self._view(fx, padded, full=False)
            self._metadata(batch, in_capture=True)
            self._capture(padded, batch, padded, fx, fx.plan.num_tokens)

    def _replay(self, fx: Fixture, full: bool) -> Replayed:
        padded = bucket_for(fx.plan.num_tokens, TOKEN_BUCKETS)
        n = fx.plan.num_tokens
        batch = self._view(fx, padded, full)
        guard = Guard()
        with guard.watching():
            self._metadata(batch)
        if self.capturing:
            outs, swapped, memory = self._run(padded, padded, guard)
        else:
            swapped = []
            with guard.watching():
                outs = self._step_piecewise(batch, n, padded)
            memory = canary_figures(guard)
        return self._replayed(outs, fx, padded, swapped, memory)

    def _step_piecewise(self, batch: ForwardBatch, n: int, padded: int) -> List[torch.Tensor]:
        """The padded call, eager; for a real-rows-only backend, what SGLang's layer does: the
        backend on the real rows, zeros for the padded ones."""
        if not self.real_rows_only:
            return self._step(batch, padded)
        real = dataclasses.replace(batch, out_cache_loc=batch.out_cache_loc[:n], positions=batch.positions[:n])
        return [torch.cat([out, out.new_zeros((padded - n,) + tuple(out.shape[1:]))])
                for out in self._step(real, n)]

    def _where(self, fx: Fixture) -> str:
        return f", {fx.plan.num_tokens} tokens"

    def _graph_name(self, key: int) -> str:
        return f"token bucket {key}"


HARNESSES = {GraphBuckets.BATCH_SIZE: BatchGraphs, GraphBuckets.TOKEN_COUNT: ExtendGraphs}


def harness_for(backend, fixtures: Sequence[Fixture], caps: Optional[Capabilities] = None) -> _Harness:
    """The harness of the fixtures' mode's graph contract (it sets up the backend's graph state);
    `caps`: the backend's, as read when it was loaded (else read from its class)."""
    return HARNESSES[rules_for(fixtures[0].case.mode).graph](backend, caps or Capabilities.of(type(backend)), fixtures)
