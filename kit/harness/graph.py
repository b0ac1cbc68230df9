"""The graph harness: the production capture/replay contract (SPEC "Graph mode").

Batch-size graphs (DECODE / TARGET_VERIFY / DRAFT_EXTEND_V2, ...): static buffers sized for the
largest bucket of the engine's batch sizes, one graph captured per bucket (the engine's warm-up
runs on a side stream first), then replays in mixed order with padded rows as the engine's profile fills them
(kit.engine.profile: a padded token's KV slot, a padded request's seq_len). The static buffers are
the fields the batch's converter lists (kit.engine.render.STATIC_FIELDS, kept by
kit.harness.static): the harness names none of an engine's fields. Token graphs (EXTEND,
piecewise contract): the token axis is padded to a token bucket. A graph records the whole step
program of a batch: the in-graph metadata, then every step's forward for every layer.

The backend's hooks are driven in its own style (kit.harness.hooks). Every second replay hands the
backend full-capacity request buffers (rows past the batch hold what earlier batches left there),
as SGLang's draft-extend runner does.

A capture compiles nothing (kit.harness.compiles.none_inside): the engine's warm-ups run the backend
as the capture does, watched alike, so torch.compile compiles there.

Without CUDA the same hooks, warm-ups, buffers, padding and order run without a graph ("emulated"):
forward() runs again at each replay, but with the backend's Python state put back to what it was
at capture (kit.harness.hoststate), as a real graph keeps its launch arguments; a tensor the replay
hooks replaced is named. Allocations of the hooks and of the captured forward carry canary tails
(kit.harness.guard), on GPU too, so a write past one is seen after each replay.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
from typing import Dict, List, Optional, Sequence

import torch

from kit.engine.batch import ForwardBatch
from kit.engine.fixture import Fixture
from kit.engine.modes import rules_for
from kit.engine.modes.rules import GraphBuckets
from kit.engine.render import graph_batch, seq_lens_sum
from kit.engine.variants import bucket_for
from kit.harness import compiles, mirrors
from kit.harness.capabilities import Capabilities
from kit.harness.checks import Handed, Pending, handed_inputs, inputs_figures
from kit.harness.guard import Guard, canary_figures
from kit.harness.hooks import driver_for
from kit.harness.hoststate import Bindings, replaced, tensor_pointers
from kit.harness.program import Program, forward_program
from kit.harness.protocol import seq_len_fill_value
from kit.harness.static import StaticBatch
from kit.report.record import CUDA_GRAPH, EMULATED, PIECEWISE_EAGER

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
    outs: List[List[torch.Tensor]]  # per step, per layer, the output of the real rows
    lses: List[List[Optional[torch.Tensor]]]  # the same of the log-sum-exp forward() returned (None: none)
    padded: List[torch.Tensor]  # the outputs of the padded rows (every step, every layer)
    replaced: List[str]  # backend attributes holding another tensor than at capture (emulated graphs)
    memory: Pending  # canaries of what the hooks and the captured forward allocated (kit.harness.guard)
    inputs: List[Pending]  # the static inputs kept, at this replay and the captures since the last


@dataclasses.dataclass
class _Captured:
    batch: ForwardBatch  # the batch object the captured program saw (views of static buffers)
    graph: Optional["torch.cuda.CUDAGraph"] = None
    program: Optional[Program] = None  # what forward_program returned
    guard: Optional[Guard] = None  # real graphs: canary tails of what the captured program allocated
    bindings: Optional[Bindings] = None  # emulated: the backend's Python state at capture
    pointers: Dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _StepInputs:
    """One step's static q/k/v per layer, and its tokens per request."""

    q: List[torch.Tensor]
    k: List[torch.Tensor]
    v: List[torch.Tensor]
    v_in_k: List[bool]  # per layer: V is a view of K (MLA's latent), not an input of its own
    per_request: int  # rows of each request in this step (0: ragged, the token axis is padded instead)


class _Harness:
    """Static buffers, captures and replays for one run's fixtures (one pool, one model)."""

    def __init__(self, backend, caps: Capabilities, fixtures: Sequence[Fixture], buckets: Sequence[int],
                 max_tokens: int, token_axis: bool):
        self.backend = backend
        self.caps = caps
        self.profile = caps.profile
        self.driver = driver_for(backend, caps)
        self.layers = fixtures[0].layers
        self.pools = fixtures[0].pools
        self.case = fixtures[0].case
        self.mode = self.case.mode
        self.rules = rules_for(self.mode)
        self.max_bs = max(buckets)
        kv = self.pools.token_to_kv_pool
        self.device = kv.device
        self.real = self.device.type == "cuda"
        self.detail = CUDA_GRAPH if self.real else EMULATED
        self.padded_seq_len = self.profile.seq_len_pad(seq_len_fill_value(backend))
        # Rows of each step per request; a token-axis graph pads tokens, not requests.
        first = fixtures[0]
        per_request = lambda n: 0 if token_axis else n // first.batch.batch_size  # noqa: E731
        self.max_tokens = max_tokens
        self.steps = []
        for step in first.steps:
            rows = max_tokens if token_axis else self.max_bs * per_request(step.batch.num_tokens)
            q, k, v = (list(t) for t in zip(*(x.buffers(rows, self.case.inputs) for x in step.inputs)))
            self.steps.append(_StepInputs(q, k, v, [x.v_in_k for x in step.inputs], per_request(step.batch.num_tokens)))
        self.input_checks: List[Pending] = []  # of captures, judged with the next replay
        # The batch's fields its converter lists, padded as the engine's profile pads them.
        self.static = StaticBatch(first.batch, self.profile, self.padded_seq_len, self.max_bs,
                                  max_tokens if token_axis else None, ragged=token_axis)
        self.captured: Dict[int, _Captured] = {}
        # Canaries on what the backend allocates for its graphs (init_cuda_graph_state, the capture
        # hooks: the graphs read it at every replay), checked after every replay.
        self.graph_guards = [Guard("init_cuda_graph_state: ")]
        self.mempool = torch.cuda.graph_pool_handle() if self.real else None
        self.replays = 0

    def _init_state(self, max_num_tokens: int) -> None:
        """The backend's graph state, then the driver's own buffers (both for the largest batch).
        What the backend allocates for its graphs carries canary tails, checked after every replay:
        a graph buffer sized short (a factor missing, the model's context length for the request
        pool's) is written past by a replay's hooks or by the graph itself."""
        with self.graph_guards[0].watching():
            self.backend.init_cuda_graph_state(self.max_bs, max_num_tokens)
        self.driver.prepare(self.max_bs, self.pools.req_to_token_pool.req_to_token, self.pools.token_to_kv_pool.page_size,
                            self.device, self.padded_seq_len)

    def _program(self, batch: ForwardBatch, rows: List[int]) -> Program:
        """What a graph records: the in-graph metadata, then every step's forward for every layer
        on the first rows[i] rows of step i's static inputs."""
        self.driver.in_graph(batch)
        views = self.rules.step_batches(batch, len(self.steps))
        static = [[(q[:n], k[:n], v[:n]) for q, k, v in zip(s.q, s.k, s.v)] for s, n in zip(self.steps, rows)]
        return forward_program(self.backend, self.layers, views, static)

    def _rows(self, padded_requests: int, padded_tokens: int) -> List[int]:
        """Rows of each step's static inputs a graph of this size runs."""
        return [padded_tokens if s.per_request == 0 else padded_requests * s.per_request for s in self.steps]

    def _kept(self, fx: Optional[Fixture], real: List[int], padded: List[int], where: str = "") -> Pending:
        """The static inputs after a program, against what the kit loaded: each step's real rows of
        `fx` (its own inputs), zeros past them up to its padded rows."""
        handed: List[Handed] = []
        rows = "padded rows" if fx is not None else "zeroed rows"
        for i, s in enumerate(self.steps):
            step = f", step {i + 1}" if len(self.steps) > 1 else ""
            if fx is not None:
                handed += handed_inputs(fx.steps[i], [(q[:real[i]], k[:real[i]], v[:real[i]])
                                                      for q, k, v in zip(s.q, s.k, s.v)], step + where)
            for layer, q, k, v, v_in_k in zip(self.layers, s.q, s.k, s.v, s.v_in_k):
                tail = [("q", q), ("k", k)] + ([] if v_in_k else [("v", v)])
                handed += [Handed(name, f"layer {layer.layer_id}{step}, {rows}{where}", t[real[i]:padded[i]],
                                  first_row=real[i]) for name, t in tail]
        return inputs_figures(handed)

    def _capture_hooks(self, hooks, *args, **kwargs):
        """The driver's capture hooks (`hooks(*args, **kwargs)`), what they allocate watched as the
        graph state is: a backend may make a graph's buffers at its first capture."""
        guard = Guard("the capture hooks: ")
        self.graph_guards.append(guard)
        with guard.watching():
            return hooks(*args, **kwargs)

    def _warm_up(self, batch: ForwardBatch, rows: List[int]) -> None:
        """The engine's warm-up runs before a capture, each after the capture hook, watched as the
        captured run is: torch.compile keys a compiled function's cache on its inputs' dispatch keys,
        which a watching guard's mode changes inside a custom op's implementation (reached below
        autograd, as vLLM's layers reach their impl), so a warm-up run unwatched would leave the
        captured run to compile again, inside the capture."""
        # Emulated, one warm-up stands for the engine's: a second identical one leaves the capture nothing
        # new, and each interpreted forward costs seconds.
        warmups = self.profile.capture_warmups if self.real else min(1, self.profile.capture_warmups)
        for _ in range(warmups):
            with Guard().watching():
                self.driver.before_capture_run(batch)
                self._program(batch, rows)

    def _capture(self, key: int, batch: ForwardBatch, rows: List[int], fx: Optional[Fixture] = None,
                 real: Optional[List[int]] = None) -> None:
        """Captures graph `key` on rows[i] rows of each step's static inputs, which hold `fx`'s first
        real[i] rows (else zeros): the engine's warm-ups, then the capture hook, then the captured
        run, which may compile nothing (compiles.none_inside)."""
        name = f"the capture of {self._graph_name(key)}"
        if not self.real:
            self._warm_up(batch, rows)
            self._capture_hooks(self.driver.before_capture_run, batch)
            with compiles.none_inside(name), Guard().watching():
                self._program(batch, rows)  # capture-time output is discarded
            self.captured[key] = _Captured(batch, bindings=Bindings.of(self.backend),
                                           pointers=tensor_pointers(self.backend))
        else:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._warm_up(batch, rows)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self._capture_hooks(self.driver.before_capture_run, batch)  # what the graph reads: watched
            graph, guard = torch.cuda.CUDAGraph(), Guard()
            # capture_begin/end on a side stream, as torch.cuda.graph does, without its empty_cache():
            # run after run, that handed the cache back and the next batch's allocations went to cudaMalloc.
            with compiles.none_inside(name), _no_collection(), torch.cuda.stream(side), guard.watching():
                graph.capture_begin(pool=self.mempool)
                try:
                    program = self._program(batch, rows)
                finally:
                    graph.capture_end()
            self.captured[key] = _Captured(batch, graph, program, guard)
        self.input_checks.append(self._kept(fx, real or [0] * len(rows), rows, f", at {name}"))

    def _run(self, key: int, rows: List[int], guard: Guard):
        """Replays graph `key` after its hooks ran (under `guard`): (forward_program's, replaced tensors, memory)."""
        cap = self.captured[key]
        if self.real:
            cap.graph.replay()
            return cap.program, [], canary_figures(guard, cap.guard, *self.graph_guards)
        swapped = replaced(cap.pointers, tensor_pointers(self.backend))
        after_hooks = Bindings.of(self.backend)
        cap.bindings.restore()
        try:
            with guard.watching():
                program = self._program(cap.batch, rows)
        finally:
            after_hooks.restore()  # forward's own Python side effects do not happen in a real replay
        return program, swapped, canary_figures(guard, *self.graph_guards)

    def _load(self, fx: Fixture, requests: int, tokens: Optional[int], padded_rows: List[int]) -> List[int]:
        """The batch copied into the static buffers, padded up to `requests` requests and `tokens`
        tokens (None: the requests'), and each step's real rows into its static inputs, padded
        rows zeros. Returns each step's real rows."""
        self.static.load(fx.batch, requests, tokens)
        real = []
        for s, step, rows in zip(self.steps, fx.steps, padded_rows):
            m = step.batch.num_tokens
            for i, x in enumerate(step.inputs):
                for buf, src in ((s.q[i], x.q), (s.k[i], x.k_new), (s.v[i], x.v_new)):
                    buf[:m].copy_(src)
                    buf[m:rows].zero_()
            real.append(m)
        return real

    def _replayed(self, program: Program, fx: Fixture, real: List[int], swapped: List[str],
                  memory: Pending, padded: List[int]) -> Replayed:
        """Real and padded rows of the outputs, per step and layer (padded ones only where a padded
        token belongs to a request: else nothing computes them); the static inputs judged kept
        (and those of the captures since the last replay)."""
        inputs, self.input_checks = self.input_checks + [self._kept(fx, real, padded)], []
        outs, lses = program
        judged = [o[n:] for step, n in zip(outs, real) for o in step] if self.profile.padded_rows_attend else []
        real_rows = [[o if o is None else o[:n] for o in step] for step, n in zip(lses, real)]
        return Replayed([[o[:n] for o in step] for step, n in zip(outs, real)], real_rows, judged, swapped, memory,
                        inputs)

    def _graph_name(self, key: int) -> str:
        raise NotImplementedError

    def capture(self) -> None:
        """Captures every graph that does not need a real batch, before any replay."""

    def prepare(self, fx: Fixture) -> None:
        """Captures what replaying `fx` needs (the pool is installed for judging after this)."""

    def replay(self, fx: Fixture, regime: Optional[mirrors.Regime] = None) -> Replayed:
        """`regime`: how the replay hooks are handed the host mirrors (kit.harness.mirrors)."""
        i, self.replays = self.replays, self.replays + 1
        return self._replay(fx, full_capacity(i), regime)

    def _replay(self, fx: Fixture, full: bool, regime: Optional[mirrors.Regime]) -> Replayed:
        raise NotImplementedError

    def _mirrored(self, view: ForwardBatch, fx: Fixture, regime: Optional[mirrors.Regime]) -> ForwardBatch:
        return mirrors.handed(view, [r.n_new for r in fx.plan.requests], regime, self.caps.host_mirrors)

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
    TARGET_VERIFY, DRAFT_EXTEND_V2, ...)."""

    def __init__(self, backend, caps: Capabilities, fixtures: Sequence[Fixture]):
        sizes = caps.profile.batch_sizes
        buckets = sorted({bucket_for(fx.batch.batch_size, sizes) for fx in fixtures}, reverse=True)
        first = fixtures[0]
        tokens = first.batch.num_tokens // first.batch.batch_size
        super().__init__(backend, caps, fixtures, buckets, max(buckets) * tokens, token_axis=False)
        self.sizes, self.buckets = sizes, buckets
        self.tokens_per_req = tokens
        self._init_state(self.max_bs * max(s.per_request for s in self.steps))

    def _spec_info(self, bs: int, real_rows: int, real_mask: Optional[torch.Tensor]):
        return self.rules.spec_info(self.case, bs, real_rows, real_mask, self.padded_seq_len, self.device)

    def _view(self, bs: int, spec_info, full: bool) -> ForwardBatch:
        return graph_batch(self.rules.graph_mode(), bs, self.static.held(bs, full=full), self.pools, spec_info)

    def capture_bucket(self, bs: int) -> None:
        self.static.fill(bs)
        batch = self._view(bs, self._spec_info(bs, 0, None), full=False)
        rows = self._rows(bs, 0)
        batch = self._capture_hooks(self.driver.capture, batch, bs * self.tokens_per_req)
        self._capture(bs, batch, rows)

    def capture(self) -> None:
        for bs in self.buckets:  # largest first, as engines capture
            self.capture_bucket(bs)

    def _replay(self, fx: Fixture, full: bool, regime: Optional[mirrors.Regime]) -> Replayed:
        b = fx.batch
        bs = b.batch_size
        pbs = bucket_for(bs, self.sizes)
        # Rows past pbs keep what earlier batches left: a full-capacity view shows them.
        rows = self._rows(pbs, 0)
        real = self._load(fx, pbs, None, rows)
        real_mask = b.spec_info.custom_mask if b.spec_info is not None else None
        view = self._view(pbs, self._spec_info(pbs, bs, real_mask), full)
        view = self._mirrored(view, fx, regime)
        guard = Guard()
        with guard.watching():
            self.driver.replay(view, fx.plan, pbs * self.tokens_per_req)
        program, swapped, memory = self._run(pbs, rows, guard)
        return self._replayed(program, fx, real, swapped, memory, rows)

    def _where(self, fx: Fixture) -> str:
        return f" in bucket {bucket_for(fx.batch.batch_size, self.sizes)}"

    def _graph_name(self, key: int) -> str:
        return f"bucket {key}"


class TokenGraphs(_Harness):
    """The piecewise contract: the token axis padded to a token bucket (EXTEND); one graph per
    token bucket, replayed with any batch whose tokens fit it, whatever its request count."""

    def __init__(self, backend, caps: Capabilities, fixtures: Sequence[Fixture]):
        self.token_buckets = caps.profile.token_buckets
        max_tokens = max(fx.batch.num_tokens for fx in fixtures)
        max_bs = bucket_for(max(fx.batch.batch_size for fx in fixtures), caps.profile.batch_sizes)
        super().__init__(backend, caps, fixtures, [max_bs], bucket_for(max_tokens, self.token_buckets), token_axis=True)
        self.real_rows_only = caps.real_rows_only
        # A backend that sees only the real rows cannot have them captured: their count varies.
        self.capturing = caps.extend_capture and not self.real_rows_only
        if not self.capturing:
            self.detail = PIECEWISE_EAGER
        self._init_state(self.max_tokens)

    def _graph_requests(self, fx: Fixture, padded: int) -> int:
        """Requests the graph of token bucket `padded` is replayed with: the batch's own, or where
        the profile pads them, as many as the bucket has tokens, up to the largest batch."""
        return min(padded, self.max_bs) if self.profile.pads_token_graph_requests else fx.batch.batch_size

    def _view(self, fx: Fixture, padded: int, full: bool) -> ForwardBatch:
        """The batch over the static buffers: its requests copied in, then padded requests up to the
        graph's count (rows past them keep what earlier batches left), its tokens padded to the
        bucket, in the mode the graph is replayed as (a MIXED batch as EXTEND: ModeRules.graph_mode)."""
        rows = self._graph_requests(fx, padded)
        self._load(fx, rows, padded, [padded] * len(self.steps))
        held = self.static.held(rows, padded, full)
        return dataclasses.replace(fx.batch, batch_size=rows, **held, seq_lens_sum=seq_lens_sum(held, rows),
                                   forward_mode=self.rules.graph_mode())

    def prepare(self, fx: Fixture) -> None:
        padded = bucket_for(fx.batch.num_tokens, self.token_buckets)
        if self.capturing and padded not in self.captured:
            n = fx.batch.num_tokens
            batch = self._capture_hooks(self.driver.ragged, self._view(fx, padded, full=False), fx.plan, in_capture=True)
            self._capture(padded, batch, [padded] * len(self.steps), fx, [n] * len(self.steps))

    def _replay(self, fx: Fixture, full: bool, regime: Optional[mirrors.Regime]) -> Replayed:
        n = fx.batch.num_tokens
        padded = bucket_for(n, self.token_buckets)
        batch = self._mirrored(self._view(fx, padded, full), fx, regime)
        guard = Guard()
        with guard.watching():
            batch = self.driver.ragged(batch, fx.plan)
        rows = [padded] * len(self.steps)
        if self.capturing:
            program, swapped, memory = self._run(padded, rows, guard)
        else:
            swapped = []
            with guard.watching():
                program = self._program_piecewise(batch, n, padded)
            memory = canary_figures(guard, *self.graph_guards)
        return self._replayed(program, fx, [n] * len(self.steps), swapped, memory, rows)

    def _program_piecewise(self, batch: ForwardBatch, n: int, padded: int) -> Program:
        """The padded call, eager; for a real-rows-only backend, what SGLang's layer does: the
        backend on the real rows, zeros for the padded ones."""
        if not self.real_rows_only:
            return self._program(batch, [padded] * len(self.steps))
        real = dataclasses.replace(batch, **self.static.first_tokens(batch, n))
        outs, lses = self._program(real, [n] * len(self.steps))
        return ([[torch.cat([out, out.new_zeros((padded - n,) + tuple(out.shape[1:]))]) for out in step]
                 for step in outs], lses)

    def _where(self, fx: Fixture) -> str:
        return f", {fx.batch.num_tokens} tokens"

    def _graph_name(self, key: int) -> str:
        return f"token bucket {key}"


HARNESSES = {GraphBuckets.BATCH_SIZE: BatchGraphs, GraphBuckets.TOKEN_COUNT: TokenGraphs}


def harness_for(backend, fixtures: Sequence[Fixture], caps: Optional[Capabilities] = None) -> _Harness:
    """The harness of the fixtures' mode's graph contract (it sets up the backend's graph state);
    `caps`: the backend's, as read when it was loaded (else read from its class)."""
    return HARNESSES[rules_for(fixtures[0].case.mode).graph](backend, caps or Capabilities.of(type(backend)), fixtures)
