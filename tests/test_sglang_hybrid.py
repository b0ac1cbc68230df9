"""SGLang's hybrid GDN backend (sglang_gdn_hybrid: HybridLinearAttnBackend over TritonAttnBackend and
GDNAttnBackend) on the smoke hybrid decode and verify cases it runs on CPU (its prefill runs on CUDA GPUs only, see
supports()), eager and under a graph, and the planted bugs of the full layers' KV routed to the wrong
pool layer and of their graph metadata not refreshed before a replay caught.
Skipped, with the reason, only where the pinned sglang is not installed (CI installs it)."""
import pytest
import torch

from backends.sglang.adapter import sglang_problem
from cases.linear import SMOKE
from kit.harness.recurrent import failures, run_case
from kit.harness.runner import default_device
from kit.modes import Exec
from kit.report.record import KERNEL, KV_WRITE

pytestmark = pytest.mark.skipif(sglang_problem() is not None, reason=str(sglang_problem()))
CASE = next(c for c in SMOKE if c.name == "hybrid_gdn_decode_saved_fp32")
VERIFY = next(c for c in SMOKE if c.name == "hybrid_gdn_verify_fp32")


def _run(backend_cls, exec_=Exec.EAGER, case=CASE):
    from backends.sglang import runtime  # noqa: F401 - SGLang's set-up (interpreter, shims)
    from kit.harness import interpreter

    interpreter.install()
    return failures(run_case(backend_cls, case, exec_, device=default_device()))


@pytest.mark.parametrize("exec_", list(Exec), ids=lambda e: e.value)
def test_sglangs_hybrid_backend_passes_the_saved_decode(exec_):
    from backends.sglang import SGLangGDNHybridBackend

    assert _run(SGLangGDNHybridBackend, exec_) is None


def test_sglangs_hybrid_backend_passes_the_verify_and_the_decode_after_it():
    from backends.sglang import SGLangGDNHybridBackend

    assert _run(SGLangGDNHybridBackend, case=VERIFY) is None


def test_sglangs_hybrid_verify_graph_is_right_but_for_kf91s_padded_rows():
    """The full layers (mask, KV pool) and every pool right under a graph; the linear layers' padded
    rows read what their conv never wrote (KNOWN_FAILURES.md KF-91, as sglang_gdn's verify graph)."""
    from backends.sglang import SGLangGDNHybridBackend

    said = _run(SGLangGDNHybridBackend, Exec.GRAPH, VERIFY)
    assert said is not None and said.startswith(f"{KERNEL}: target_verify graph: ") and said.endswith(
        "padded output rows NaN/inf") and "|" not in said, said


def test_full_layers_metadata_not_replayed_is_caught_in_the_graph_run_and_the_eager_run_passes():
    """tests/mutants/hybrid.py's mutant 155: before the replay, the linear side's graph metadata alone."""
    from tests.mutants.hybrid import SGLangFullMetadataNotReplayed

    assert _run(SGLangFullMetadataNotReplayed) is None
    said = _run(SGLangFullMetadataNotReplayed, Exec.GRAPH)
    assert said is not None and said.startswith(f"{KERNEL}: decode graph, full-attention layers"), said


def test_full_layers_kv_written_to_the_wrong_pool_layer_is_caught():
    """tests/mutants/hybrid.py's mutant 152: both full layers write KV layer 1."""
    from tests.mutants.hybrid import SGLangKVLayerByModelId

    said = _run(SGLangKVLayerByModelId)
    assert said is not None and said.startswith(KV_WRITE), said


def test_a_linear_model_and_the_prefill_on_cpu_are_declined_with_their_reasons():
    from backends.sglang import SGLangGDNHybridBackend

    linear = next(c for c in SMOKE if c.name == "gdn_decode_fp32")
    assert "sglang_gdn runs it" in SGLangGDNHybridBackend.supports(linear)
    extend = next(c for c in SMOKE if c.name == "hybrid_gdn_extend_bf16")
    said = SGLangGDNHybridBackend.supports(extend)
    if torch.cuda.is_available():  # the prefill's kernels are CUDA's: declined on CPU only
        assert said is None, said
    else:
        assert "tl.make_block_ptr" in said or "bf16 on CPU" in said
