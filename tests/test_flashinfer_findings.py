"""What FlashInfer's own sink wrapper does that the in-box adapter works around, shown on a GPU: the
kit fails it, and passes the adapter on the same cases."""
import pytest
import torch

from backends import flashinfer as adapter
from backends.flashinfer import UNAVAILABLE, FlashInferBackend
from kit.engine.catalog import load_catalog
from kit.harness.runner import run_case
from kit.modes import Exec, ForwardMode
from kit.report.record import FAIL, PASS

pytestmark = pytest.mark.skipif(UNAVAILABLE is not None or not torch.cuda.is_available(),
                                reason=UNAVAILABLE or "FlashInfer runs on CUDA GPUs only")


class ShippedSinkWrapper(FlashInferBackend):
    """The adapter with FlashInfer's BatchAttentionWithAttentionSinkWrapper as shipped."""

    name = "flashinfer_shipped_sink_wrapper"

    def sink_wrapper(self, **kw):
        return adapter.flashinfer.BatchAttentionWithAttentionSinkWrapper(
            self.workspace, "NHD", backend="fa2", q_data_type=self.variant["q_data_type"],
            kv_data_type=self.variant["kv_data_type"], head_dim_qk=self.heads[2], head_dim_vo=self.heads[2],
            window_left=self.variant["window_left"], **kw)


def test_the_sink_wrappers_module_is_named_without_head_dim_so_the_second_head_dim_runs_the_first():
    """BatchAttentionWithAttentionSinkWrapper names its JIT module by q dtype and window alone
    (flashinfer/attention/_core.py, 0.7.2): after a head_dim 128 case, gpt-oss's head_dim 64 runs
    the 128 kernel (or a rebuild over it). The adapter, building the module under FlashInfer's
    full name, passes both."""
    catalog = load_catalog()
    first, second = (catalog.find_case(ForwardMode.EXTEND, name) for name in ("gqa_sinks_p16", "gptoss_sinks_p16"))
    shipped = [run_case("tests.test_flashinfer_findings:ShippedSinkWrapper", c, Exec.EAGER) for c in (first, second)]
    assert shipped[0].outcome == PASS, shipped[0].message
    assert shipped[1].outcome == FAIL, "FlashInfer's sink wrapper ran gpt-oss's head_dim right after head_dim 128"
    assert [run_case("flashinfer", c, Exec.EAGER).outcome for c in (first, second)] == [PASS, PASS]
