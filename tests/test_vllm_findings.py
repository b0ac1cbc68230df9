"""Evidence for the vLLM findings in KNOWN_FAILURES.md, each on the failing run's own batch, outside
the suite: vLLM's backend built as the adapter builds it and called once. Skipped, with the reason,
only where the pinned vllm is not installed, or where the finding is another device's."""
import pytest
import torch

from backends.vllm.adapter import VllmFlexAttentionBackend, vllm_problem
from kit.engine.catalog import load_catalog
from kit.engine.variants import variant
from kit.harness.hooks import driver_for
from kit.harness.runner import default_device
from kit.modes import Exec, ForwardMode
from tests.helpers import run_setup

pytestmark = pytest.mark.skipif(vllm_problem() is not None, reason=str(vllm_problem()))
ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="PyTorch's CPU flex attention template: CPU runs only")


def _eager_sequence(mode, case_name, backend_cls, derived=lambda case: case):
    """The case's eager batches (or those of `derived(case)`) on one backend instance, in order, as the
    suite runs them: the metadata, then every layer's forward."""
    case = derived(load_catalog().find_case(mode, case_name))
    setup = run_setup(case, Exec.EAGER, default_device(), backend_cls)
    backend = setup.new_backend()
    driver = driver_for(backend, setup.caps)
    for fx in setup.fixtures:
        fx.install()
        batch = driver.eager(fx.batch)
        for layer, x in zip(fx.layers, fx.steps[0].inputs):
            backend.forward(x.q, x.k_new, x.v_new, layer, batch)


@ON_CPU
def test_kf31_flex_cpu_decoding_template_reads_full_blocks_a_mask_without_them_lacks():
    """PyTorch's CPU flex decoding template reads full_kv_num_blocks unconditionally
    (cpp_flex_attention_template.py:696-700); vLLM's FLEX builds its block masks without full
    blocks (flex_attention.py:805): the generated C++ does not compile."""
    with pytest.raises(Exception, match="full_kv_num_blocks. was not declared"):
        _eager_sequence(ForwardMode.DECODE, "mha_bs1_window_p64_inter", VllmFlexAttentionBackend)


@ON_CPU
def test_kf32_flex_cpu_template_asserts_a_mask_as_wide_as_the_kv_cache():
    """PyTorch's CPU flex template asserts the KV length fits the block mask's KV indices
    (flex_cpu.py:322-326); vLLM's direct-built masks list the blocks a batch uses, narrower than
    the paged KV cache it hands as K and V. Shown on a batch of two more requests than the case (as an
    eager run's first batch was before it carried the case's recurring request)."""
    with pytest.raises(Exception, match="KV seqlen must be smaller than the block_mask size"):
        _eager_sequence(ForwardMode.EXTEND, "gqa32_scale_fp16_p16_shuf", VllmFlexAttentionBackend,
                        lambda case: variant(case, case.bs + 2, 8, tag="step"))
