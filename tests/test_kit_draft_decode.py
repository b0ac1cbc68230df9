"""The multi-step draft decode (DRAFT_DECODE) as a step program: its requests' lanes and each step's
keys, the batches forward() gets, the KV check over every step's writes (the lanes' last column
never written), verdicts per step, the model's context length a backend is built with, and the
canaries on what a backend allocates for its graphs."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backends.torch_native import TorchNativeBackend
from kit.engine.inputs import streams
from kit.engine.modes import rules_for
from kit.engine.pools import CASE_LAYER_ID
from kit.harness.checks import check_kv
from kit.harness.runner import run_case
from kit.harness.verdict import kv_state
from kit.modes import Exec, ForwardMode
from kit.report.record import FAIL, GRAPH, KERNEL, KV_WRITE, PASS
from tests.helpers import make_fixture, run_setup, small_case
from tests.toys.dense import DenseGraphBackend

DRAFT_DECODE = ForwardMode.DRAFT_DECODE
MODULE = "tests.test_kit_draft_decode"
# Two lanes of three columns a request: two steps, one query row a lane
TREE = small_case("dd_tree", DRAFT_DECODE, (5, 9), 5, topk=2, steps=3)


def test_a_step_is_a_row_a_lane_over_the_committed_tokens_and_the_lane_so_far():
    fx = make_fixture(TREE)
    lanes, steps = TREE.topk, TREE.steps
    r2t = fx.pools.req_to_token_pool.req_to_token
    batch = fx.batch
    assert batch.batch_size == TREE.bs and batch.seq_lens.tolist() == list(TREE.prefix)
    # out_cache_loc in (request, lane, column) order: req_to_token[row, seq_len + k*S + s]
    expected = [int(r2t[r.row, r.seq_len + k * steps + s]) for r in fx.plan.requests for k in range(lanes)
                for s in range(steps)]
    assert batch.out_cache_loc.tolist() == expected
    assert batch.positions.tolist() == [p for p in TREE.prefix for _ in range(lanes)]
    assert len(fx.steps) == steps - 1
    drawn = streams(fx.plan, fx.layers, TREE.torch_dtype, "cpu")[CASE_LAYER_ID]
    for step in fx.steps:
        i = step.index
        view = step.batch
        assert view.batch_size == TREE.bs and view.spec_info.draft_step == i
        assert view.out_cache_loc.tolist() == expected[i::steps]
        assert view.positions.tolist() == [p + i for p in TREE.prefix for _ in range(lanes)]
        rows = step.plan.requests
        assert len(rows) == TREE.bs * lanes
        for z, row in enumerate(rows):
            b, k = divmod(z, lanes)
            seq_len = TREE.prefix[b]
            assert row.keys == list(range(seq_len)) + [seq_len + k * steps + j for j in range(i + 1)]
            assert (row.n_old, row.n_new, row.q_pos) == (seq_len + i, 1, [seq_len + i])
            # its query is the lane's column i of the request's draws, wherever the batch puts it
            assert torch.equal(step.inputs[CASE_LAYER_ID].q[z], drawn[b].q[k * steps + i])
            assert torch.equal(step.inputs[CASE_LAYER_ID].k_new[z], drawn[b].k[seq_len + k * steps + i])


def _write_steps(fx, steps, extra=None):
    """Writes each step's new K/V of every layer where forward() would (and `extra` slots too)."""
    pool = fx.pools.token_to_kv_pool
    for step in steps:
        for layer, x in zip(fx.layers, step.inputs):
            pool.set_kv_buffer(layer, step.batch.out_cache_loc, x.k_new, x.v_new)
    if extra is not None:
        for layer, x in zip(fx.layers, fx.steps[0].inputs):
            pool.set_kv_buffer(layer, extra, x.k_new[:extra.numel()], x.v_new[:extra.numel()])


def test_the_kv_check_covers_every_steps_writes_and_the_unwritten_last_column():
    fx = make_fixture(TREE)
    _write_steps(fx, fx.steps)
    assert check_kv(fx.pools.token_to_kv_pool, kv_state(fx, scratch=True)).ok
    fx.install()
    _write_steps(fx, fx.steps[:-1])  # the last step's writes missing
    check = check_kv(fx.pools.token_to_kv_pool, kv_state(fx, scratch=True))
    assert check.num_missing == TREE.bs * TREE.topk * len(fx.layers), check.describe()
    fx.install()
    last_column = fx.batch.out_cache_loc.view(TREE.bs, TREE.topk, TREE.steps)[:, :, -1].reshape(-1)
    _write_steps(fx, fx.steps, extra=last_column)  # a lane's column S - 1 is never written
    check = check_kv(fx.pools.token_to_kv_pool, kv_state(fx, scratch=True))
    assert check.num_collateral == last_column.numel() * len(fx.layers) and not check.num_missing, check.describe()


class LastStepOwnKeyMissed(TorchNativeBackend):
    """Planted: the last draft step leaves the query's own token out of its keys."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        spec = batch.spec_info
        if batch.forward_mode is DRAFT_DECODE and spec.draft_step == spec.num_steps - 2:
            missed = [dataclasses.replace(r, n_old=r.n_old - 1, keys=r.key_tokens[:-1], visible=r.visible[:, :-1])
                      for r in batch.step.requests]
            batch = dataclasses.replace(batch, step=dataclasses.replace(batch.step, requests=missed))
        return super().forward(q, k, v, layer, batch, save_kv_cache)


def test_every_step_is_judged():
    r = run_case(f"{MODULE}:LastStepOwnKeyMissed", TREE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, KERNEL), r.message
    assert "step 2, layer 0 output wrong" in r.message and "step 1, layer 0 output wrong" not in r.message


@pytest.mark.parametrize("case", [TREE, small_case("ctx_tv", ForwardMode.TARGET_VERIFY, (5, 9), 3),
                                  small_case("ctx_decode", ForwardMode.DECODE, (5, 9))], ids=lambda c: c.mode.value)
def test_at_the_context_edge_the_model_context_length_is_the_longest_committed_sequence(case):
    """A backend is built with the model's context length: the req_to_token rows' width, or at the
    context edge the run's longest committed sequence (seq_lens), what the mode writes past it
    (drafts, lanes) in the rows' headroom, as SGLang sizes its rows past model_config.context_len."""
    for edge in (False, True):
        setup = run_setup(case.with_(context_edge=edge), Exec.GRAPH, "cpu", TorchNativeBackend)
        ctx = setup.new_backend().ctx
        longest = max(r.seq_len for fx in setup.fixtures for r in fx.plan.requests)
        assert ctx.context_len == (longest if edge else ctx.max_context_len)
        assert longest < ctx.max_context_len


class GraphStateOverrun(DenseGraphBackend):
    """Planted: a buffer made in init_cuda_graph_state, its replay hook writing one element past its end."""

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        self.scratch = torch.zeros(3, dtype=torch.int32, device=self.ctx.device)

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs):
        super().init_forward_metadata_replay_cuda_graph(*args, **kwargs)
        self.scratch.as_strided((4,), (1,))[3] = 7


class CaptureAllocationOverrun(DenseGraphBackend):
    """Planted: a buffer made by the capture hook, the replay hook writing one element past its end."""

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs):
        super().init_forward_metadata_capture_cuda_graph(*args, **kwargs)
        self.scratch = torch.zeros(3, dtype=torch.int32, device=self.ctx.device)

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs):
        super().init_forward_metadata_replay_cuda_graph(*args, **kwargs)
        self.scratch.as_strided((4,), (1,))[3] = 7


@pytest.mark.parametrize("attr, where", [("GraphStateOverrun", "init_cuda_graph_state: (3,) int32"),
                                         ("CaptureAllocationOverrun", "the capture hooks: (3,) int32")])
def test_a_write_past_what_a_backend_allocated_for_its_graphs_is_caught(attr, where):
    case = small_case("state_overrun", ForwardMode.DECODE, (3, 10, 6))
    assert run_case(f"tests.toys.dense:DenseGraphBackend", case, Exec.GRAPH).outcome == PASS
    r = run_case(f"{MODULE}:{attr}", case, Exec.GRAPH)
    assert (r.outcome, r.failure_class) == (FAIL, GRAPH), r.message
    assert f"wrote past the end of 1 tensor(s) it allocated: {where}" in r.message


class LastColumnWritten(TorchNativeBackend):
    """Planted: each step also writes its K/V to the lane's last column (which no step owns)."""

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        spec = batch.spec_info
        if save_kv_cache and batch.forward_mode is DRAFT_DECODE:
            rows = batch.seq_lens.repeat_interleave(spec.topk).long() + spec.num_steps - 1
            lanes = torch.arange(spec.topk).repeat(batch.batch_size) * spec.num_steps
            pool_rows = batch.req_pool_indices.repeat_interleave(spec.topk).long()
            last = batch.req_to_token_pool.req_to_token[pool_rows, rows + lanes].long()
            batch.token_to_kv_pool.set_kv_buffer(layer, last, k, v)
        return super().forward(q, k, v, layer, batch, save_kv_cache)


def test_a_write_to_a_lanes_last_column_is_a_kv_write_failure():
    r = run_case(f"{MODULE}:LastColumnWritten", TREE, Exec.EAGER)
    assert (r.outcome, r.failure_class) == (FAIL, KV_WRITE), r.message
    assert "stray writes" in r.message


def test_step_views_are_device_operations_on_the_metadata_batch():
    """A step's batch is derived from the batch the metadata hooks got (a graph records it): from a
    full-capacity view, the same columns of the same rows."""
    fx = make_fixture(TREE)
    rules = rules_for(DRAFT_DECODE)
    longer = dataclasses.replace(fx.batch, out_cache_loc=torch.cat([fx.batch.out_cache_loc, fx.batch.out_cache_loc]),
                                 positions=torch.cat([fx.batch.positions, fx.batch.positions]))
    for i in range(len(fx.steps)):
        view = rules.step_batch(longer, i)
        assert torch.equal(view.out_cache_loc, fx.steps[i].batch.out_cache_loc)
        assert torch.equal(view.positions, fx.steps[i].batch.positions)


def test_a_draft_of_two_steps_is_one_forward_on_its_step_batch():
    """steps = 2: one forward, on step 0's batch (column 0 of every lane), not on the batch the
    metadata hooks got (every column): one step, but of a multi-step mode."""
    chain = small_case("dd_chain2", DRAFT_DECODE, (5, 9), 3)
    fx = make_fixture(chain)
    [step] = fx.steps
    assert step.batch is not fx.batch and step.batch.spec_info.draft_step == 0
    assert step.batch.out_cache_loc.tolist() == fx.batch.out_cache_loc[::2].tolist()
    for exec_ in (Exec.EAGER, Exec.GRAPH):
        r = run_case("torch_native" if exec_ is Exec.EAGER else "triton", chain, exec_)
        assert r.outcome == PASS, r.message
