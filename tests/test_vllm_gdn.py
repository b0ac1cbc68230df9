"""vLLM's GDN_ATTN adapter (backends/vllm/gdn.py) without CUDA: its layers and vLLM's own
GDNAttentionMetadataBuilder built as on a GPU, the kit's steps rendered as its CommonAttentionMetadata.
vLLM's kernels run on CUDA only (gdn.CPU_REASON), so here a toy of vLLM's rule
(tests/toys/per_token_blocks.py) computes each step from the state blocks and kept-token counts
vLLM's builder took from the adapter's rendering: right, the kit passes it; with one request's state
block rendered one slot off, the kit fails it. The GPU runs are in docs/vllm.md."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backends.vllm.gdn import CPU_REASON, VllmGdnBackend, layer_name
from cases.linear import SMOKE
from kit.harness.recurrent import run_case
from kit.report.record import KV_WRITE
from tests.toys.per_token_blocks import PerTokenBlocksLinear

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
