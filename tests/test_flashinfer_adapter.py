"""The FlashInfer adapter's host-side logic, on CPU (its kernels need CUDA)."""
import pytest
import torch

from backends.flashinfer import window_on_positions
from cases import CATALOG
from kit.engine.catalog import CASE_SETS
from kit.modes import ForwardMode
from kit.engine.plan import plan_case
from kit.engine.reference import visibility
from tests.helpers import small_case

TV = ForwardMode.TARGET_VERIFY
WINDOWED = [small_case("tree_w2", TV, (9, 0, 4), 7, topk=2, window=2),
            small_case("tree_w5_topk3", TV, (30, 6), 8, topk=3, window=5)] + [
    c for s in CASE_SETS for c in CATALOG.cases(s, TV) if c.window >= 0]


@pytest.mark.parametrize("case", WINDOWED, ids=lambda c: c.name)
def test_verify_window_folds_into_the_mask_on_positions(case):
    """The mask FlashInfer gets for a windowed TARGET_VERIFY is the kit's own visibility:
    tree structure and the window on positions (seq_len + depth), not on token index."""
    plan = plan_case(case)
    mask = torch.cat([r.visible.reshape(-1) for r in plan.requests])
    seq_lens = torch.tensor([r.seq_len for r in plan.requests], dtype=torch.int32)
    folded = window_on_positions(mask, seq_lens, case.new, case.window)
    expected = torch.cat([visibility(r.visible, r.q_pos, r.key_pos, case.window, "cpu").reshape(-1)
                          for r in plan.requests])
    assert torch.equal(folded, expected)


def test_mla_with_an_fp8_e5m2_cache_is_unsupported_with_flashinfers_reason():
    """FlashInfer's MLA planner refuses an fp8_e5m2 latent (it raises at plan()); e4m3 and the model
    dtypes are its to run."""
    from backends.flashinfer_mla import FlashInferMLABackend
    from kit.engine.case import DEEPSEEK_SCALE
    mla = dict(heads=(16, 1), head_dim=576, kv_lora_rank=512, rope_dim=64, dtype="bf16", scale=DEEPSEEK_SCALE)
    e5m2 = small_case("m", ForwardMode.DECODE, (9, 4), **mla, kv_dtype="fp8_e5m2")
    assert "_fa_common.py:142" in FlashInferMLABackend.supports(e5m2)
    e4m3 = FlashInferMLABackend.supports(e5m2.with_(kv_dtype="fp8_e4m3")) or ""
    assert "fp8_e5m2" not in e4m3 and "_fa_common" not in e4m3


def test_mla_forward_hands_on_the_natural_log_sum_exp_its_plan_asks_for():
    """The MLA backend inherits returns_lse from the dense one, so its forward returns the LSE too
    (it returned the output alone, and every run failed the kit's check); the wrapper gives it in
    the natural base only where the plan asked for that mode."""
    from types import SimpleNamespace
    from backends.flashinfer_mla import FlashInferMLABackend
    assert FlashInferMLABackend.returns_lse
    layer = SimpleNamespace(tp_q_head_num=16, kv_lora_rank=512, rope_dim=64, scaling=0.1, k_scale=None, layer_id=0)
    ctx = SimpleNamespace(layers=[layer], page_size=4, dtype=torch.bfloat16, kv_cache_dtype=torch.bfloat16,
                          device="cpu")
    backend = FlashInferMLABackend(ctx)
    assert backend.variant["lse_mode"] == "basee"
    calls = {}

    class Wrapper:
        def run(self, **kw):
            calls.update(kw)
            return "out", "lse"

    class Pool:
        def set_kv_buffer(self, *args):
            pass

        def get_key_buffer(self, layer_id):
            return torch.zeros(8, 1, 576)

    backend.wrapper = Wrapper()
    batch = SimpleNamespace(token_to_kv_pool=Pool(), out_cache_loc=None)
    assert backend.forward(torch.zeros(3, 16, 576), None, None, layer, batch) == ("out", "lse")
    assert calls["return_lse"] is True and calls["return_lse_base_on_e"] is True
