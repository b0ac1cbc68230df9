"""vLLM's GDN_ATTN adapter (backends/vllm/gdn.py) without CUDA: its layers and vLLM's own
GDNAttentionMetadataBuilder built as on a GPU, the kit's steps rendered as its CommonAttentionMetadata.
vLLM's kernels run on CUDA only (gdn.CPU_REASON), so here a toy of vLLM's rule
(tests/toys/per_token_blocks.py) computes each step from the state blocks and kept-token counts
vLLM's builder took from the adapter's rendering: right, the kit passes it; with one request's state
block rendered one slot off, the kit fails it. vLLM's builder also runs on a virtual CUDA device
(tests/virtual_cuda.py), where a tensor the adapter hands on the wrong side of host and device
raises as on a GPU. The GPU runs are in docs/vllm.md."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backends.vllm.gdn import CPU_REASON, VllmGdnBackend, layer_name, runtime
from cases.linear import SMOKE
from kit.engine.recurrent_step import build
from kit.engine.state_pool import StatePool
from kit.harness.recurrent import RecurrentContext, padded_bucket, run_case
from kit.harness.recurrent_rules import rule_of
from kit.harness.scope import recurrent_graph_reason
from kit.modes import Exec, ForwardMode
from kit.report.record import KV_WRITE
from tests.toys.per_token_blocks import PerTokenBlocksLinear
from tests.virtual_cuda import CUDA, VirtualCuda

VERIFY = next(c for c in SMOKE if c.name == "gdn_verify_bf16")


class OneRequestOneSlotOff(VllmGdnBackend):
    """The adapter's rendering with the first request's state blocks one slot off."""

    def _common(self, batch):
        common = super()._common(batch)
        common.block_table_tensor[0] += 1
        return common


def _driven_by(adapter):
    class BuilderDriven(PerTokenBlocksLinear):
        """The toy, its state blocks and kept-token counts those vLLM's builder made of the adapter's rendering."""

        def __init__(self, ctx):
            super().__init__(ctx)
            self.vllm = adapter(ctx)

        def init_forward_metadata(self, batch):
            self.vllm.init_forward_metadata(batch)
            md = self.vllm.metadata[layer_name(self.vllm.ctx.layers[0])]
            blocks = md.spec_state_indices_tensor
            assert blocks is not None and md.num_spec_decodes == batch.batch_size  # vLLM's speculative path
            super().init_forward_metadata(dataclasses.replace(batch, state_indices=blocks[:, 0], state_blocks=blocks,
                                                              num_accepted_tokens=md.num_accepted_tokens))
    return BuilderDriven


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's view of the adapter; CUDA runs vLLM's kernels")
def test_without_cuda_its_cases_name_why():
    assert {VllmGdnBackend.supports(c) for c in SMOKE if c.kind == "gdn"} == {CPU_REASON}


def test_vllms_builder_reads_the_kit_s_blocks_and_kept_tokens_and_a_slot_off_is_caught():
    verdicts = run_case(_driven_by(VllmGdnBackend), VERIFY)
    assert [v.ok for v in verdicts] == [True, True], [v.text for v in verdicts]
    planted = run_case(_driven_by(OneRequestOneSlotOff), VERIFY)
    assert not planted[0].ok and planted[0].failure_class == KV_WRITE, planted[0].text


class IsPrefillingOnTheDevice(VllmGdnBackend):
    """The adapter's rendering with is_prefilling on the device (vLLM's runner keeps it on the host)."""

    def _common(self, batch):
        common = super()._common(batch)
        common.is_prefilling = common.is_prefilling.to(common.query_start_loc.device)
        return common


# vLLM's GDN layers alone: a hybrid model is a case of backends that serve its full layers too (vLLM has none)
GDN_RUNS = [(c, e) for c in SMOKE if c.kind == "gdn" and not c.layer_pattern for e in Exec
            if e == Exec.EAGER or recurrent_graph_reason(c) is None]


def metadata_on_cuda(adapter, case, exec_):
    """vLLM's builder for a CUDA device over the adapter's rendering of the case's batch, made on
    that device as the harness makes it (a graph's padded rows included): the metadata."""
    fx = build(case, "cpu", layout=rule_of(adapter.profile).layout(case))
    graph = exec_ == Exec.GRAPH
    max_bs = padded_bucket(case.bs, adapter.profile) if graph else case.bs
    drafts = case.new if case.mode == ForwardMode.TARGET_VERIFY else 0
    pool = StatePool(fx.geometry, fx.torch_dtype, "cpu")
    backend = adapter(RecurrentContext(torch.device("cpu"), fx.torch_dtype, pool, fx.layers, max_bs, drafts))
    with VirtualCuda():
        with runtime().set_current_vllm_config(backend.vllm_config):
            backend.builder = backend.metadata_builder(CUDA)
        batch, _ = fx.batch(CUDA, max_bs if graph else None, adapter.padded_state_slot,
                            empty_padding=adapter.profile.padded_query_len == 0)
        backend.init_forward_metadata(batch)
        return backend.metadata[adapter.layer_name(fx.layers[0])]


@pytest.mark.parametrize("case,exec_", GDN_RUNS, ids=[f"{c.name}-{e.value}" for c, e in GDN_RUNS])
def test_vllms_builder_on_cuda_takes_the_adapter_s_tensors_each_on_its_side(case, exec_):
    metadata = metadata_on_cuda(VllmGdnBackend, case, exec_)
    assert_each_on_its_side(metadata)


def assert_each_on_its_side(metadata) -> None:
    """Every tensor of vLLM's metadata on the device, but those named _cpu, on the host."""
    with VirtualCuda():
        sides = {f.name: getattr(metadata, f.name).device.type for f in dataclasses.fields(metadata)
                 if isinstance(getattr(metadata, f.name), torch.Tensor)}
    wrong = {name: side for name, side in sides.items() if side != ("cpu" if name.endswith("_cpu") else "cuda")}
    assert sides and not wrong, f"metadata tensors on the wrong side: {wrong}"


@pytest.mark.parametrize("case,exec_", GDN_RUNS, ids=[f"{c.name}-{e.value}" for c, e in GDN_RUNS])
def test_is_prefilling_on_the_device_raises_where_vllms_builder_reads_it(case, exec_):
    """vLLM's builder reads is_prefilling beside the host query lengths outside its speculative path
    (gdn_attn.py: no_prior_state &= m.is_prefilling), so every mode but a verify raises, as the
    adapter with it on the device crashed in DECODE, EXTEND and MIXED on an H200 and passed TARGET_VERIFY."""
    if case.mode == ForwardMode.TARGET_VERIFY:
        metadata_on_cuda(IsPrefillingOnTheDevice, case, exec_)
        return
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        metadata_on_cuda(IsPrefillingOnTheDevice, case, exec_)


def test_prefill_rows_load_their_own_saved_states_and_mutant_141_is_caught():
    """vLLM's builder over a mixed step in its runner's order (decodes first, then a saved request of
    several tokens, then a new one): the prefill rows' has-a-saved-state flags are theirs; mutant 141
    (a copy of vLLM's build reading them from the step's first rows) gives the new request a saved state."""
    from tests.mutants.vllm_linear import GdnPrefillInitialStatesOfTheFirstRows

    case = next(c for c in SMOKE if c.name == "gdn_mixed_fp32")
    saved = sorted(((p > 0, n) for p, n in zip(case.prefix, case.new_lens)), key=lambda r: (not r[0], r[1] > 1))
    expected = [s for s, n in saved if not s or n > 1]
    assert expected == [True, False]
    assert metadata_on_cuda(VllmGdnBackend, case, Exec.EAGER).prefill_has_initial_state.tolist() == expected
    planted = metadata_on_cuda(GdnPrefillInitialStatesOfTheFirstRows, case, Exec.EAGER)
    assert planted.prefill_has_initial_state.tolist() != expected
