"""Evidence for the vLLM findings in KNOWN_FAILURES.md, each on the failing run's own batch, outside
the suite: vLLM's backend built as the adapter builds it and called once. Skipped, with the reason,
only where the pinned vllm is not installed, or where the finding is another device's."""
import dataclasses
import functools

import pytest
import torch

from backends.vllm.adapter import VllmFlexAttentionBackend, vllm_problem
from kit.engine.catalog import load_catalog
from kit.harness.capabilities import Capabilities
from kit.harness.hooks import driver_for
from kit.harness.runner import default_device
from kit.harness.scope import unsupported_reason
from kit.modes import Exec, ForwardMode
from kit.report.known_failures import load_or_default, match
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
    the paged KV cache it hands as K and V (64 pages here, a mask of 48 in the first batch)."""
    with pytest.raises(Exception, match="KV seqlen must be smaller than the block_mask size"):
        _eager_sequence(ForwardMode.MIXED, "gqa32_scale_fp16_p16_shuf", VllmFlexAttentionBackend)


# What PyTorch's CPU flex attention lowering (torch 2.13) does with the block mask vLLM's FLEX built for a
# batch, decided from the mask alone: it asserts the mask as wide as the KV it is handed (flex_cpu.py:322-326:
# KF-32), and for one query token, every size static (the adapter keeps them so on CPU), its partition of 128
# keys a multiple of the page and at least 512 keys, it picks its decoding template
# (cpp_flex_attention_template.py, choose_flex_template), whose C++ does not compile without full blocks (KF-31).
MASK_NARROWER = "KV seqlen must be smaller than the block_mask size"
DECODING_TEMPLATE = "full_kv_num_blocks"
PARTITION = 128


def _cpu_flex_meets(block_mask) -> str:
    """The PyTorch failure a batch's block mask meets on CPU ('' for none)."""
    q_tokens, kv_tokens = block_mask.seq_lengths
    kv_block = block_mask.BLOCK_SIZE[1]
    if block_mask.kv_indices.shape[-1] * kv_block < kv_tokens:
        return MASK_NARROWER
    if q_tokens == 1 and PARTITION % kv_block == 0 and kv_tokens >= max(2 * PARTITION, 512):
        return DECODING_TEMPLATE
    return ""


@functools.lru_cache(maxsize=None)
def _flex_smoke_runs_on_cpu():
    """Each eager smoke run of vLLM's FLEX on CPU, (mode, case, dtype), with the failure its batches meet
    first, from the masks vLLM's builder makes for them (nothing compiled)."""
    cls, caps, catalog = VllmFlexAttentionBackend, Capabilities.of(VllmFlexAttentionBackend), load_catalog()
    runs = []
    for mode in ForwardMode:
        for case in catalog.matrix_cases("smoke", mode):
            if unsupported_reason(cls, caps, case, Exec.EAGER):
                continue
            setup = run_setup(case, Exec.EAGER, "cpu", cls)
            backend = setup.new_backend()
            driver, met = driver_for(backend, setup.caps), ""
            for fx in setup.fixtures:
                fx.install()
                driver.eager(fx.batch)
                met = met or _cpu_flex_meets(next(iter(backend.metadata.values())).block_mask)
            runs.append((mode.value, case.name, case.dtype, met))
    return tuple(runs)


def _entries_unlike_the_masks(entries):
    """The runs whose entry (its crash text, or none) is not what the masks say they meet."""
    wrong = []
    for mode, case, dtype, met in _flex_smoke_runs_on_cpu():
        entry = match(entries, VllmFlexAttentionBackend.name, mode, "eager", case, "CPU (x86_64)", dtype)
        if (entry.text if entry else "") != met:
            wrong.append(f"{mode} {case}: entry {entry.id if entry else None}, the masks say {met or 'none'}")
    return wrong


@ON_CPU
def test_flex_cpu_entries_match_exactly_the_runs_whose_masks_meet_their_pytorch_bug():
    """KF-31's and KF-32's rows (and KF-31's in MIXED) cover exactly the smoke runs whose batches meet
    that PyTorch check first, and no other run of FLEX on CPU has an entry."""
    assert _flex_smoke_runs_on_cpu(), "no eager smoke run of vLLM's FLEX on CPU"
    assert _entries_unlike_the_masks(load_or_default()) == []


@ON_CPU
def test_an_entry_pattern_wider_than_its_runs_is_told():
    """KF-32 as it stood (EXTEND and TARGET_VERIFY of the 32-head case, whose masks are wide enough)."""
    entries = [dataclasses.replace(e, mode="[et]*", case="gqa32*_scale_fp16_p16_shuf") if e.id == "KF-32" else e
               for e in load_or_default()]
    assert any("entry KF-32, the masks say none" in line for line in _entries_unlike_the_masks(entries))
