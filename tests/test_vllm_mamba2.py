"""vLLM's MAMBA2_ATTN adapter (backends/vllm/mamba2.py) without CUDA: its MambaMixer2 layers and vLLM's
own Mamba2AttentionMetadataBuilder built as on a GPU, the kit's steps rendered as its
CommonAttentionMetadata. vLLM's mixer ops run on CUDA only (mamba2.CPU_REASON), so here the in-box
PyTorch recurrence (tests/toys/per_token_blocks.py) computes each step from what vLLM's builder made
of the adapter's rendering: which rows are decodes and which prefills, each row's state block (and a
verify's blocks per token and kept-token counts), and whether a prefill row loads its saved state.
Right, the kit passes it; with a planted rendering bug, or vLLM's builder patched (a copy of its
code), the kit fails it. The builder also runs on a virtual CUDA device (tests/virtual_cuda.py). The
GPU runs are in docs/vllm.md."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backends.vllm.mamba2 import CPU_REASON, VllmMamba2Backend, layer_name
from cases.linear import SMOKE
from kit.harness.capabilities import Capabilities
from kit.harness.recurrent import run_case
from kit.harness.scope import recurrent_graph_reason, unsupported_reason
from kit.modes import Exec, ForwardMode
from kit.report.record import KERNEL, KV_WRITE
from tests.mutants.vllm_linear import Mamba2InitialStatesOfTheFirstRows
from tests.test_vllm_gdn import assert_each_on_its_side, metadata_on_cuda
from tests.toys.per_token_blocks import PerTokenBlocksLinear

MAMBA2 = [c for c in SMOKE if c.kind == "mamba2"]
# What vLLM's runner serves (a verify only of requests with a saved state: VllmMamba2Backend.supports).
SERVED = [c for c in MAMBA2 if not (c.mode == ForwardMode.TARGET_VERIFY and 0 in c.prefix)]
CASE = {c.name: c for c in MAMBA2}


def _driven_by(adapter):
    class BuilderDriven(PerTokenBlocksLinear):
        """The toy, run on the step as vLLM's builder split it: rows in its order, decodes first, each
        row's state block, a prefill row's saved state loaded where has_initial_states_p says, a
        verify's blocks and kept-token counts."""

        def __init__(self, ctx):
            super().__init__(ctx)
            self.vllm = adapter(ctx)

        def init_forward_metadata(self, batch):
            self.vllm.init_forward_metadata(batch)
            super().init_forward_metadata(_as_built(batch, self.vllm.metadata[layer_name(self.vllm.ctx.layers[0])]))

        def forward(self, projected, *gates_and_layer):
            *gates, layer, batch = gates_and_layer
            handed = self.vllm.to_vllm_order(projected, *gates)
            return self.vllm.to_kit_order(super().forward(*handed, layer, batch))
    return BuilderDriven


def _as_built(batch, md):
    """The kit's batch as vLLM's Mamba2 metadata describes it: its rows, their tokens, blocks and
    saved states (a decode row continues its state)."""
    d, p = md.num_decodes, md.num_prefills
    decode_lens = (torch.diff(md.query_start_loc_d).tolist() if md.query_start_loc_d is not None else [1] * d)
    prefill_lens = torch.diff(md.query_start_loc_p).tolist() if p else []
    lens = decode_lens + prefill_lens
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    device = batch.query_start_loc.device
    saved = [torch.ones(d, dtype=torch.bool, device=device)]
    if p:
        saved.append(md.has_initial_states_p.to(device))
    spec = md.num_accepted_tokens is not None
    return dataclasses.replace(
        batch, state_indices=torch.cat([md.state_indices_tensor_d[:, 0], md.state_indices_tensor_p]),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device), has_initial_state=torch.cat(saved),
        extend_seq_lens_cpu=lens, state_blocks=md.state_indices_tensor_d if spec else None,
        num_accepted_tokens=md.num_accepted_tokens if spec else None)


class FirstTwoRequestsBlocksSwapped(VllmMamba2Backend):
    """The adapter's rendering with the first two requests' state blocks swapped (each a slot it owns
    not: a wrong state index that stays inside the pool)."""

    def _common(self, batch):
        common = super()._common(batch)
        common.block_table_tensor[[0, 1]] = common.block_table_tensor[[1, 0]]
        return common


class SavedStatesUncounted(VllmMamba2Backend):
    """The adapter's rendering with each request's seq_len its new tokens alone (its saved prefix left
    out): vLLM's builder reads no prefill row as continuing a saved state (has_initial_states_p)."""

    def _common(self, batch):
        common = super()._common(batch)
        common.seq_lens = torch.diff(common.query_start_loc)
        return common


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's view of the adapter; CUDA runs vLLM's kernels")
def test_without_cuda_its_cases_name_why():
    assert {VllmMamba2Backend.supports(c) for c in MAMBA2} == {CPU_REASON}


@pytest.mark.parametrize("case", SERVED, ids=lambda c: c.name)
def test_vllms_builder_splits_the_adapter_s_rendering_as_the_kit_s_step(case):
    verdicts = run_case(_driven_by(VllmMamba2Backend), case)
    assert all(v.ok for v in verdicts), [v.text for v in verdicts]


def test_decode_rows_reach_vllms_builder_first_as_its_runner_orders_them():
    """MIXED's decode rows come last in the kit's step; vLLM's builder takes a step's first rows as
    its decodes, so the adapter hands them first: the builder counts them as decodes."""
    case = CASE["mamba2_mixed_fp32"]  # prefix (7, 0, 12), new (5, 1, 1): one decode row, last
    seen = {}

    class Seen(VllmMamba2Backend):
        def init_forward_metadata(self, batch):
            super().init_forward_metadata(batch)
            seen["md"] = self.metadata[layer_name(self.ctx.layers[0])]

    run_case(_driven_by(Seen), case)
    md = seen["md"]
    assert (md.num_decodes, md.num_prefills) == (1, 2)
    assert md.has_initial_states_p.tolist() == [True, False]  # the saved extend row, then the new request


@pytest.mark.parametrize("planted,case,caught", [
    (FirstTwoRequestsBlocksSwapped, "mamba2_mixed_fp32", (KV_WRITE, KERNEL)),
    (FirstTwoRequestsBlocksSwapped, "mamba2_verify_saved_bf16", (KV_WRITE, KERNEL)),
    (SavedStatesUncounted, "mamba2_extend_chunks_bf16", (KERNEL, KV_WRITE)),
    (Mamba2InitialStatesOfTheFirstRows, "mamba2_mixed_fp32", (KERNEL, KV_WRITE)),
], ids=lambda x: x if isinstance(x, str) else getattr(x, "__name__", None))
def test_a_planted_rendering_or_builder_bug_is_caught(planted, case, caught):
    verdicts = run_case(_driven_by(planted), CASE[case])
    bad = [v for v in verdicts if not v.ok]
    assert bad and bad[0].failure_class in caught, [v.text for v in verdicts]


MAMBA2_RUNS = [(c, e) for c in SERVED for e in Exec if e == Exec.EAGER or recurrent_graph_reason(c) is None]


@pytest.mark.parametrize("case,exec_", MAMBA2_RUNS, ids=[f"{c.name}-{e.value}" for c, e in MAMBA2_RUNS])
def test_vllms_builder_on_cuda_takes_the_adapter_s_tensors_each_on_its_side(case, exec_):
    assert_each_on_its_side(metadata_on_cuda(VllmMamba2Backend, case, exec_))


class Served(VllmMamba2Backend):
    """The adapter as where its mixer runs: supports() takes the case."""

    @classmethod
    def supports(cls, case):
        return None


@pytest.mark.parametrize("case,graph_runs", [("mamba2_decode_fresh_bf16", False), ("mamba2_decode_fp32", False),
                                             ("mamba2_decode_bf16_long", True), ("mamba2_verify_saved_bf16", True)])
def test_a_graph_of_a_step_with_a_new_request_reads_unsupported_as_vllm_captures_none(case, graph_runs):
    """vLLM captures recurrent layers in full graphs for uniform decode batches only: a new request's
    step (a prefill) runs without one; eager it runs."""
    caps, case = Capabilities.of(Served), CASE[case]
    assert unsupported_reason(Served, caps, case, Exec.EAGER) is None
    reason = unsupported_reason(Served, caps, case, Exec.GRAPH)
    assert (reason is None) == graph_runs, reason
    assert graph_runs or "uniform decode batches only" in reason
