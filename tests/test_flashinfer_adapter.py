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
