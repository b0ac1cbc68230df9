"""The graph harness follows the production capture/replay contract (real CUDA graphs on a GPU).

Every test that runs the harness is parametrized over devices: cpu always (emulated
graphs) and cuda when available (real CUDA graphs).
"""
from __future__ import annotations

import dataclasses
import functools
import gc

import pytest
import torch

from backends.torch_native import TorchNativeBackend
from kit.engine.case import LAYOUTS
from kit.harness.compiles import CompiledInCapture
from kit.harness.graph import BatchGraphs, _Harness, _no_collection, full_capacity, harness_for
from kit.modes import Exec, ForwardMode
from kit.engine.plan import plan_case
from kit.engine.pools import CASE_LAYER_ID
from kit.harness.protocol import AttentionBackend
from kit.engine.modes import rules_for
from kit.engine.profile import SGLANG, SGLANG_BATCH_SIZES as BS_BUCKETS, SGLANG_TOKEN_BUCKETS as TOKEN_BUCKETS
from kit.engine.variants import bucket_for
from kit.harness.runner import run_case
from tests.helpers import run_setup, small_case

DECODE, EXTEND, MIXED = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED
TARGET_VERIFY, DRAFT_EXTEND_V2 = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2
DRAFT_DECODE = ForwardMode.DRAFT_DECODE
MODULE = "tests.test_kit_graph_harness"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DENSE = "tests.toys.dense:DenseGraphBackend"
STALE = "tests.toys.dense:StaleReplayBackend"


def graph_detail(device: str) -> str:
    return "cuda-graph" if device == "cuda" else "emulated"




# bs = 3: its bucket is 4, so every replay of the case itself has one padded row.
HARNESS_CASES = {
    DECODE: small_case("gh_decode", DECODE, (3, 10, 6)),
    TARGET_VERIFY: small_case("gh_tv", TARGET_VERIFY, (4, 0, 9), 4, topk=2, page=16),
    DRAFT_EXTEND_V2: small_case("gh_dev2", DRAFT_EXTEND_V2, (2, 7, 12), 3, layout="shuffled_pages"),
    DRAFT_DECODE: small_case("gh_dd", DRAFT_DECODE, (2, 7, 12), 5, topk=2, steps=3),
}
# Token-bucket graph cases (ragged batches)
TOKEN_CASES = {EXTEND: small_case("nohooks_ext", EXTEND, (2, 5), (3, 1)),
               MIXED: small_case("nohooks_mixed", MIXED, (2, 5), (3, 1))}


def tokens_per_req(case) -> int:
    """KV slots (out_cache_loc) of each request."""
    return rules_for(case.mode).tokens_per_request(case)


def rows_per_req(case) -> int:
    """Query rows of each request in each step's forward (positions alike): a draft decode's lanes."""
    return case.topk if case.mode is DRAFT_DECODE else tokens_per_req(case)


def steps_of(case) -> int:
    return (case.steps or case.new - 1) - 1 if case.mode is DRAFT_DECODE else 1


# ------------------------------------------------------------------ replay schedule


def test_replay_schedule_order():
    """Schedule: a larger bucket first, then the case, then bs=1, then the case's bs again with other lengths."""
    case = HARNESS_CASES[DECODE]
    sched = rules_for(case.mode).replay_schedule(case, SGLANG)
    assert [c.bs for c in sched] == [8, 3, 1, 3]
    assert bucket_for(sched[0].bs, BS_BUCKETS) > bucket_for(case.bs, BS_BUCKETS)
    assert sched[1] is case
    assert sched[3].prefix != case.prefix
    assert all(a > b for a, b in zip(sched[3].prefix, case.prefix))
    assert len({c.name for c in sched}) == len(sched)
    assert all(c.mode is case.mode and c.layout == case.layout and c.heads == case.heads for c in sched)
    one = case.with_(name="bs1", prefix=(5,))
    assert [c.bs for c in rules_for(one.mode).replay_schedule(one, SGLANG)] == [2, 1, 1]
    assert rules_for(one.mode).replay_schedule(one, SGLANG)[2].prefix != (5,)


# ------------------------------------------------------------------ recording fake backend


class RecordingBackend(AttentionBackend):
    """Records every hook call; forward writes K/V and returns zeros (capturable)."""

    name = "recording"
    profile = SGLANG
    FILL = 1

    def __init__(self, ctx):
        super().__init__(ctx)
        self.calls = []
        self.harness = None  # set by the test so replay can read the harness's static buffers

    def init_forward_metadata(self, batch) -> None:
        self.calls.append(("init_forward_metadata", batch.batch_size))

    def init_cuda_graph_state(self, max_bs, max_num_tokens) -> None:
        self.calls.append(("state", max_bs, max_num_tokens))

    @staticmethod
    def _spec(spec_info):
        if spec_info is None:
            return {}
        rec = {"draft": spec_info.draft_token_num}
        if spec_info.custom_mask is not None:
            rec["mask"] = spec_info.custom_mask.cpu().clone()
        if spec_info.extend_seq_lens_tensor is not None:
            rec["ext"] = spec_info.extend_seq_lens_tensor.tolist()
            rec["num_tokens_per_bs"] = spec_info.num_tokens_per_bs
        return rec

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                 forward_mode, spec_info) -> None:
        self.calls.append(("capture", dict(bs=bs, num_tokens=num_tokens, rows=req_pool_indices.tolist(),
                                           seq_lens=seq_lens.tolist(), mode=forward_mode, **self._spec(spec_info))))

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                forward_mode, spec_info, seq_lens_cpu) -> None:
        held = self.harness.static.held(bs)  # the graph's static buffers, as the replay loaded them
        self.calls.append(("replay", dict(
            bs=bs, rows=req_pool_indices.tolist(), seq_lens=seq_lens.tolist(), seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu.tolist(), seq_lens_cpu_device=seq_lens_cpu.device.type,
            mode=forward_mode, out_cache_loc=held["out_cache_loc"].tolist(), positions=held["positions"].tolist(),
            **self._spec(spec_info))))

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.FILL

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        self.calls.append(("forward", batch.batch_size, q.shape[0]))
        if save_kv_cache:
            batch.token_to_kv_pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
        return torch.zeros_like(q)


class RecordingFill2Backend(RecordingBackend):
    """Same, with a seq_lens fill value of 2: padded rows must carry 2, not the default 1."""

    FILL = 2


class OneWarmupRecordingBackend(RecordingBackend):
    """Same, under an engine that warms a graph up once before its capture (vLLM's runner)."""

    profile = dataclasses.replace(SGLANG, name="one-warmup", capture_warmups=1)


class TwoPhaseRecordingBackend(RecordingBackend):
    """The same records through SGLang 0.5.23's two-phase hooks: out_graph stands for the
    capture hook (in_capture=True) or the replay hook, in_graph is recorded in the graph."""

    init_forward_metadata_capture_cuda_graph = None
    init_forward_metadata_replay_cuda_graph = None

    def init_forward_metadata_out_graph(self, batch, in_capture=False):
        rec = dict(bs=batch.batch_size, rows=batch.req_pool_indices.tolist(), seq_lens=batch.seq_lens.tolist(),
                   seq_lens_sum=batch.seq_lens_sum, seq_lens_cpu=batch.seq_lens_cpu.tolist(),
                   seq_lens_cpu_device=batch.seq_lens_cpu.device.type, mode=batch.forward_mode,
                   num_tokens=batch.num_tokens, out_cache_loc=batch.out_cache_loc.tolist(),
                   positions=batch.positions.tolist(), **self._spec(batch.spec_info))
        self.calls.append(("capture" if in_capture else "replay", rec))

    def init_forward_metadata_in_graph(self, batch):
        self.calls.append(("in_graph", batch.batch_size))


def drive_batch_graphs(case, backend_cls, device):
    """Fixtures, backend and harness built by the runner's own setup; capture, then replay each."""
    setup = run_setup(case, Exec.GRAPH, device, backend_cls)
    fixtures = setup.fixtures
    backend = setup.new_backend()
    harness = harness_for(backend, fixtures)
    assert isinstance(harness, BatchGraphs)
    backend.harness = harness
    max_bs = harness.max_bs
    harness.capture()
    outs = []
    for fx in fixtures:
        harness.prepare(fx)
        fx.install()
        # Copied at once, as the runner judges at once: with real graphs sharing one memory pool,
        # a replay's output is only valid until the next replay.
        outs.append(harness.replay(fx).outs[0][1].clone())  # the only step, the case's layer
    return backend, harness, fixtures, outs, max_bs


RECORDERS = [RecordingBackend, RecordingFill2Backend, OneWarmupRecordingBackend, TwoPhaseRecordingBackend]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_cls", RECORDERS, ids=["fill1", "fill2", "one_warmup", "two_phase"])
@pytest.mark.parametrize("mode", list(HARNESS_CASES), ids=[m.value for m in HARNESS_CASES])
def test_batch_graphs_hook_calls(mode, backend_cls, device):
    """State once first, one capture per bucket (largest first) with fill rows, then padded replays
    in order, every second one over full-capacity buffers; forward only where a graph runs it."""
    case = HARNESS_CASES[mode]
    fill, t, r = backend_cls.FILL, tokens_per_req(case), rows_per_req(case)
    backend, harness, fixtures, outs, max_bs = drive_batch_graphs(case, backend_cls, device)
    assert harness.detail == graph_detail(device)
    hooks = [c for c in backend.calls if c[0] not in ("forward", "in_graph")]
    assert max_bs == 8
    assert hooks[0] == ("state", max_bs, max_bs * r)
    assert [c[0] for c in hooks].count("state") == 1
    assert not [c for c in hooks if c[0] == "init_forward_metadata"], "graph mode must not use eager metadata"

    buckets = sorted({bucket_for(fx.batch.batch_size, BS_BUCKETS) for fx in fixtures}, reverse=True)
    assert buckets == [8, 4, 1]
    captures = [c[1] for c in hooks if c[0] == "capture"]
    replays = [c[1] for c in hooks if c[0] == "replay"]
    kinds = [c[0] for c in hooks[1:]]
    assert kinds == ["capture"] * len(buckets) + ["replay"] * len(fixtures), "every capture before any replay"

    for cap, bs in zip(captures, buckets):
        assert cap["bs"] == bs and cap["num_tokens"] == bs * t and cap["mode"] is mode
        assert cap["seq_lens"] == [fill] * bs
        assert cap["rows"] == [0] * bs
        if mode is TARGET_VERIFY:
            assert cap["mask"].numel() == bs * case.new * (fill + case.new) and bool(cap["mask"].all())
        if mode is DRAFT_EXTEND_V2:
            assert cap["ext"] == [case.new] * bs and cap["num_tokens_per_bs"] == case.new

    for i, (rep, fx, out) in enumerate(zip(replays, fixtures, outs)):
        b = fx.batch
        bs = b.batch_size
        pbs = bucket_for(bs, BS_BUCKETS)
        pad = pbs - bs
        # full capacity: the buffers whole, rows past the bucket holding what earlier batches left
        rows = max_bs if full_capacity(i) else pbs
        assert rep["bs"] == pbs and rep["mode"] is mode
        assert len(rep["seq_lens"]) == len(rep["rows"]) == rows
        assert rep["seq_lens"][:pbs] == b.seq_lens.tolist() + [fill] * pad
        assert rep["seq_lens_cpu"] == rep["seq_lens"] and rep["seq_lens_cpu_device"] == "cpu"
        assert rep["rows"][:pbs] == b.req_pool_indices.tolist() + [0] * pad
        assert type(rep["seq_lens_sum"]) is int
        assert rep["seq_lens_sum"] == b.seq_lens_sum + fill * pad
        assert rep["out_cache_loc"] == b.out_cache_loc.tolist() + [0] * (pad * t)
        assert rep["positions"] == b.positions.tolist() + [0] * (pad * r)
        if mode is DRAFT_EXTEND_V2:
            assert rep["ext"] == [case.new] * pbs and rep["num_tokens_per_bs"] == case.new
        if mode is TARGET_VERIFY:
            real = b.spec_info.custom_mask.cpu()
            pad_len = pad * case.new * (fill + case.new)
            assert rep["mask"].numel() == real.numel() + pad_len
            assert torch.equal(rep["mask"][:real.numel()], real)
            assert bool(rep["mask"][real.numel():].all())
        assert out.shape == fx.steps[0].inputs[CASE_LAYER_ID].q.shape  # only real rows come back
    assert [r["bs"] for r in replays] == [8, 4, 1, 4]
    assert [full_capacity(i) for i in range(4)] == [False, True, False, True]
    assert any(r["bs"] > bs for r, bs in zip(replays, [fx.batch.batch_size for fx in fixtures]))

    # A real graph runs forward (and in_graph) only at its engine's warm-ups and capture, never at replay;
    # the emulation (one warm-up standing for the engine's) runs them again at each replay but undoes their
    # Python side effects, records included.
    runs = min(1, backend_cls.profile.capture_warmups) + 1
    forwards = [c for c in backend.calls if c[0] == "forward"]
    layers = len(fixtures[0].layers)  # forward once per layer of the model, each step
    assert layers == 2
    assert [(f[1], f[2]) for f in forwards] == [(bs, bs * r) for bs in buckets
                                                for _ in range(runs * layers * steps_of(case))]
    in_graph = [c[1] for c in backend.calls if c[0] == "in_graph"]
    assert in_graph == ([bs for bs in buckets for _ in range(runs)] if backend_cls is TwoPhaseRecordingBackend
                        else [])


COMPILES = []  # the graphs torch.compile compiled of CompilingBackend's function


def _counted(gm, example_inputs):
    COMPILES.append(gm)
    return gm.forward


@functools.lru_cache(maxsize=None)
def _compiled_op():
    """A custom op whose implementation calls a torch.compile'd function, as vLLM's attention layers
    reach flex attention (unified_attention_with_output)."""
    doubled = torch.compile(lambda x: x * 2, backend=_counted, fullgraph=True)

    @torch.library.custom_op("kit_tests::doubled", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return doubled(x)
    return op


class CompilingBackend(RecordingBackend):
    """Forward calls the compiled function through the custom op."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        _compiled_op()(q)
        return super().forward(q, k, v, layer, batch, save_kv_cache)


def _compiling_harness(device):
    torch.compiler.reset()
    COMPILES.clear()
    setup = run_setup(HARNESS_CASES[DECODE], Exec.GRAPH, device, CompilingBackend)
    return harness_for(setup.new_backend(), setup.fixtures)


@pytest.mark.parametrize("device", DEVICES)
def test_warm_ups_compile_what_the_capture_runs(device):
    """A compiled function a backend calls inside a custom op compiles at the warm-ups, never in the
    capture: the warm-ups run watched as the captured run is (a guard's dispatch mode moves the op's
    implementation below autograd, and torch.compile keys its cache on the inputs' dispatch keys)."""
    _compiling_harness(device).capture()
    assert COMPILES  # it compiled, at the warm-ups (a compile in a capture raises)


@pytest.mark.parametrize("device", DEVICES)
def test_a_compile_inside_a_capture_is_reported(device, monkeypatch):
    """Planted: the warm-ups run unwatched; the captured run compiles the function again, and the
    capture says so."""
    def unwatched(self, batch, rows):
        for _ in range(self.profile.capture_warmups):
            self.driver.before_capture_run(batch)
            self._program(batch, rows)
    monkeypatch.setattr(_Harness, "_warm_up", unwatched)
    with pytest.raises(CompiledInCapture, match=r"compiled 1 function\(s\) inside the capture of bucket 8,"):
        _compiling_harness(device).capture()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", list(ForwardMode), ids=[m.value for m in ForwardMode])
def test_capture_view_carries_every_field_of_the_replay_view(mode, device):
    """What a two-phase backend reads at replay it can read at capture too (seq_lens_cpu,
    out_cache_loc, positions, spec_info...)."""
    case = HARNESS_CASES.get(mode) or small_case("gh_extend", EXTEND, (2, 9, 0), (3, 1, 5))
    seen = {}

    class FieldRecorder(TwoPhaseRecordingBackend):
        extend_capture = True

        def init_forward_metadata_out_graph(self, batch, in_capture=False):
            fields = {f.name for f in dataclasses.fields(batch) if getattr(batch, f.name) is not None}
            seen.setdefault(in_capture, set()).update(fields)

    setup = run_setup(case, Exec.GRAPH, device, FieldRecorder)
    harness = harness_for(setup.new_backend(), setup.fixtures)
    harness.capture()
    for fx in setup.fixtures:
        harness.prepare(fx)
        harness.replay(fx)
    assert seen[True] >= seen[False] >= {"seq_lens_cpu", "out_cache_loc", "positions", "req_pool_indices"}


@pytest.mark.parametrize("device", DEVICES)
def test_batch_graphs_replay_writes_kv_at_real_slots(device):
    """After a replay the pool holds each real token's K at its out_cache_loc (padded tokens went to slot 0)."""
    case = HARNESS_CASES[DECODE]
    backend, harness, fixtures, outs, _ = drive_batch_graphs(case, RecordingBackend, device)
    fx = fixtures[-1]  # the last one replayed: the pool still holds what its replay wrote
    k = fx.pools.token_to_kv_pool.get_key_buffer(CASE_LAYER_ID)
    assert torch.equal(k[fx.batch.out_cache_loc], fx.k_new)
    assert all(bool((o == 0).all()) for o in outs)


class ReplayCrashBackend(RecordingBackend):
    """Planted bug: the replay hook raises."""

    name = "replay_crash"

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs) -> None:
        raise RuntimeError("planted replay crash")


class CaptureCrashBackend(RecordingBackend):
    """Planted bug: the capture hook raises."""

    name = "capture_crash"

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs) -> None:
        raise RuntimeError("planted capture crash")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attr,stage", [("ReplayCrashBackend", "replay 1"), ("CaptureCrashBackend", "capture")])
def test_graph_hook_exception_is_crash_naming_stage(attr, stage, device):
    """An exception in a graph hook is a 'crash' whose message names the harness stage."""
    r = run_case(f"{MODULE}:{attr}", HARNESS_CASES[DECODE], Exec.GRAPH, torch.device(device))
    assert (r.outcome, r.failure_class) == ("fail", "crash"), r.message
    assert r.message.startswith(f"{stage}: RuntimeError: planted")
    assert r.repro.startswith("python -m kit run")


# ------------------------------------------------------------------ EXTEND (piecewise) and no-hook backends


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", list(ForwardMode), ids=[m.value for m in ForwardMode])
def test_torch_native_graph_is_unsupported(mode, device):
    """torch_native has no graph hooks: every graph cell is 'unsupported' with 'no capture hooks'."""
    case = TOKEN_CASES.get(mode) or HARNESS_CASES[mode]
    r = run_case("torch_native", case, Exec.GRAPH, torch.device(device))
    assert r.outcome == "unsupported" and r.message == "no capture hooks" and r.failure_class is None


class PaddingProbeBackend(TorchNativeBackend):
    """torch_native plus no-op graph hooks; records what EXTEND graph mode hands to it."""

    name = "padding_probe"
    RECORD = []
    NAN_PADDING = False  # torch_native's padded rows read zeros

    def init_cuda_graph_state(self, max_bs, max_num_tokens) -> None:
        self.RECORD.append(("state", max_bs, max_num_tokens))

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs) -> None:
        raise AssertionError("EXTEND graph mode must not call the batch capture hook")

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs) -> None:
        raise AssertionError("EXTEND graph mode must not call the batch replay hook")

    def init_forward_metadata(self, batch) -> None:
        self.RECORD.append(("init", dict(bs=batch.batch_size, extend_num_tokens=batch.extend_num_tokens,
                                         extend_seq_lens_cpu=list(batch.extend_seq_lens_cpu),
                                         seq_lens=batch.seq_lens.tolist(),
                                         num_tokens=batch.num_tokens)))
        super().init_forward_metadata(batch)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        out, lse = super().forward(q, k, v, layer, batch, save_kv_cache)
        if self.NAN_PADDING:
            out[batch.extend_num_tokens:] = float("nan")
        if layer.layer_id != CASE_LAYER_ID:  # records of the case's layer are enough
            return out, lse
        k0 = batch.token_to_kv_pool.get_key_buffer(layer.layer_id)[0]
        self.RECORD.append(("forward", dict(q_tokens=q.shape[0], k_pad=k[batch.extend_num_tokens:].cpu().clone(),
                                            out_cache_loc=batch.out_cache_loc.tolist(),
                                            positions=batch.positions.tolist(), slot0_k=k0.cpu().clone(),
                                            out=out.cpu().clone())))
        return out, lse


@pytest.mark.parametrize("device", DEVICES)
def test_extend_graph_pads_tokens_to_slot0_and_judges_real_rows(device):
    """EXTEND graph: tokens padded to a bucket write KV to slot 0 at position 0; metadata is the real batch's."""
    case = small_case("gh_extend", EXTEND, (2, 9, 0), (3, 1, 5), layout="non_monotonic_extend")
    PaddingProbeBackend.RECORD.clear()
    r = run_case(f"{MODULE}:PaddingProbeBackend", case, Exec.GRAPH, torch.device(device))
    assert r.outcome == "pass", r.message
    assert r.exec_detail == "piecewise-eager"  # no extend_capture: the padded call runs eagerly
    plans = [plan_case(c) for c in rules_for(case.mode).replay_schedule(case, SGLANG)]
    rec = PaddingProbeBackend.RECORD
    assert rec[0][0] == "state" and [x[0] for x in rec].count("state") == 1
    inits = [x[1] for x in rec if x[0] == "init"]
    forwards = [x[1] for x in rec if x[0] == "forward"]
    assert len(inits) == len(forwards) == len(plans)
    assert rec[0][2] == bucket_for(max(p.num_tokens for p in plans), TOKEN_BUCKETS)
    padded_any = False
    for plan, init, fwd in zip(plans, inits, forwards):
        n = plan.num_tokens
        padded = bucket_for(n, TOKEN_BUCKETS)
        reqs = plan.requests
        # metadata: the real batch
        assert init["bs"] == len(reqs) and init["extend_num_tokens"] == n
        assert init["extend_seq_lens_cpu"] == [q.n_new for q in reqs]
        assert init["seq_lens"][:len(reqs)] == [q.seq_len for q in reqs]  # every second replay: full capacity
        # token axis: padded to the bucket; padded tokens at slot 0, position 0
        assert init["num_tokens"] == fwd["q_tokens"] == padded
        assert fwd["out_cache_loc"] == [s for q in reqs for s in q.slots[q.n_old:]] + [0] * (padded - n)
        assert fwd["positions"] == [p for q in reqs for p in q.q_pos] + [0] * (padded - n)
        if padded > n:
            padded_any = True
            # the padded tokens' K landed in scratch slot 0 (the last padded token wins)
            assert torch.equal(fwd["slot0_k"], fwd["k_pad"][-1])
            assert torch.isfinite(fwd["out"]).all()
    assert padded_any


class UnwrittenPaddingProbe(PaddingProbeBackend):
    """Right on every real row; padded rows NaN (what an unwritten allocation holds under the kit's fill)."""

    NAN_PADDING = True


@pytest.mark.parametrize("device", DEVICES)
def test_padded_rows_must_be_finite(device):
    case = small_case("gh_extend", EXTEND, (2, 9, 0), (3, 1, 5), layout="non_monotonic_extend")
    r = run_case(f"{MODULE}:UnwrittenPaddingProbe", case, Exec.GRAPH, torch.device(device))
    assert (r.outcome, r.failure_class) == ("fail", "graph"), r.message
    assert "kv pool ok" in r.message and "padded rows not finite" in r.message


# ------------------------------------------------------------------ toy backends through run_case


def _toy_cases():
    base = [
        small_case("toy_decode", DECODE, (3, 17, 0), page=1),
        small_case("toy_tv_tree", TARGET_VERIFY, (5, 20, 1), 4, topk=2, page=16),
        small_case("toy_dev2", DRAFT_EXTEND_V2, (0, 9, 14), 3, page=1),
    ]
    return [c.with_(name=f"{c.name}_{lay}", layout=lay) for c in base for lay in LAYOUTS]


TOY_CASES = _toy_cases()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", TOY_CASES, ids=[c.name for c in TOY_CASES])
def test_dense_toy_passes_graph_on_every_layout(case, device):
    """The dense toy passes graph mode (DECODE, TARGET_VERIFY topk 2, DRAFT_EXTEND_V2) on every layout."""
    r = run_case(DENSE, case, Exec.GRAPH, torch.device(device))
    assert r.outcome == "pass", r.message
    assert r.exec_detail == graph_detail(device)
    assert r.max_err <= r.tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", TOY_CASES[::4], ids=[c.name for c in TOY_CASES[::4]])
def test_dense_toy_passes_eager(case, device):
    """Control for the graph tests: the dense toy passes eager on the same cases."""
    r = run_case(DENSE, case, Exec.EAGER, torch.device(device))
    assert r.outcome == "pass" and r.exec_detail == "eager", r.message


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", TOY_CASES[::4], ids=[c.name for c in TOY_CASES[::4]])
def test_stale_replay_fails_graph_only(case, device):
    """StaleReplayBackend (replay keeps capture-time metadata) passes eager and fails graph as 'graph'."""
    eager = run_case(STALE, case, Exec.EAGER, torch.device(device))
    assert eager.outcome == "pass", eager.message
    graph = run_case(STALE, case, Exec.GRAPH, torch.device(device))
    assert (graph.outcome, graph.failure_class) == ("fail", "graph"), graph.message
    assert graph.exec_detail == graph_detail(device)
    assert "eager on the same batch is right" in graph.message
    assert graph.message.startswith("replay 1/")
    assert graph.repro.startswith("python -m kit run") and "--exec graph" in graph.repro


def test_dense_toy_extend_is_unsupported():
    """The toy declines EXTEND through supports(), shown as 'unsupported' with its reason."""
    r = run_case(DENSE, small_case("toy_ext", EXTEND, (2,), (3,)), Exec.GRAPH, torch.device("cpu"))
    assert r.outcome == "unsupported" and r.message.startswith("toy:")


class RealRowsOnlyProbe(UnwrittenPaddingProbe):
    """Leaves padded rows unwritten, but declares it sees real rows only: the harness does
    what SGLang's attention layer does (real rows to the backend, zeros for the padded)."""

    real_rows_only = True


@pytest.mark.parametrize("device", DEVICES)
def test_real_rows_only_backend_gets_real_rows_and_zero_padding(device):
    case = small_case("gh_extend", EXTEND, (2, 9, 0), (3, 1, 5), layout="non_monotonic_extend")
    PaddingProbeBackend.RECORD.clear()
    r = run_case(f"{MODULE}:RealRowsOnlyProbe", case, Exec.GRAPH, torch.device(device))
    assert r.outcome == "pass" and r.exec_detail == "piecewise-eager", r.message
    forwards = [x[1] for x in PaddingProbeBackend.RECORD if x[0] == "forward"]
    plans = [plan_case(c) for c in rules_for(case.mode).replay_schedule(case, SGLANG)]
    assert [f["q_tokens"] for f in forwards] == [p.num_tokens for p in plans]
    assert all(len(f["out_cache_loc"]) == f["q_tokens"] for f in forwards)


@pytest.mark.parametrize("mode", list(ForwardMode), ids=[m.value for m in ForwardMode])
def test_context_describes_the_model_and_the_speculative_config(mode):
    """The backend is built knowing every layer of the model and, in the speculative modes,
    the draft count, topk and algorithm (SGLang reads them from its server config)."""
    case = TOKEN_CASES.get(mode) or HARNESS_CASES[mode]
    for hybrid in (False, True):
        setup = run_setup(case.with_(hybrid=hybrid), Exec.GRAPH, "cpu", RecordingBackend)
        ctx = setup.new_backend().ctx
        assert [layer.layer_id for layer in ctx.layers] == [0, 1] and ctx.layers == setup.fixtures[0].layers
        first, case_layer = ctx.layers
        differs = (first.scaling, first.logit_cap, first.sliding_window_size) != (
            case_layer.scaling, case_layer.logit_cap, case_layer.sliding_window_size)
        assert differs == hybrid
        assert (first.scaling != case_layer.scaling and first.sliding_window_size != case_layer.sliding_window_size
                and first.logit_cap != case_layer.logit_cap) == hybrid
        if mode in (TARGET_VERIFY, DRAFT_EXTEND_V2, DRAFT_DECODE):
            steps = case.steps or case.new - 1
            assert (ctx.speculative.num_draft_tokens, ctx.speculative.topk, ctx.speculative.num_steps) == (
                case.new, case.topk, steps)
        else:
            assert ctx.speculative is None


class _GcWatchingBackend(TwoPhaseRecordingBackend):
    """Records whether garbage collection is on while its in-graph work runs."""

    def init_forward_metadata_in_graph(self, batch):
        self.calls.append(("gc", gc.isenabled()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="only a real CUDA graph capture turns collection off")
def test_no_garbage_collection_inside_a_capture():
    """A collection inside a capture can destroy an earlier graph's CUDA objects, a call that
    invalidates the capture: collection is off while one records, and back on after."""
    backend, harness, *_ = drive_batch_graphs(HARNESS_CASES[ForwardMode.DECODE], _GcWatchingBackend, "cuda")
    seen = [on for kind, *rest in backend.calls if kind == "gc" for on in rest]
    # Warm-up runs before each capture collect as usual; the captured run does not.
    assert seen.count(False) == len(harness.captured) and gc.isenabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="only a real CUDA graph capture empties the cache")
def test_a_capture_keeps_the_allocator_cache(monkeypatch):
    """torch.cuda.graph empties the allocator's cache before every capture: run after run, each
    batch's allocations then went back to cudaMalloc. The harness captures without that."""
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    _, harness, *_ = drive_batch_graphs(HARNESS_CASES[ForwardMode.DECODE], TwoPhaseRecordingBackend, "cuda")
    assert harness.captured and not emptied


def test_collection_is_off_in_the_capture_context_and_restored_after():
    """The context a real capture runs in (checked on every device; the capture itself on CUDA above)."""
    with _no_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with _no_collection():
            pass
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
