"""vLLM's sparse MLA adapter (backends/vllm/sparse_mla.py) on the CPU: its kernels are compiled CUDA
ones, but what it hands them is checked here through vLLM's own host-side code and Triton kernels
(Triton's interpreter): the indexer rows it writes, converted as FLASHMLA_SPARSE converts them, are
the cache rows of exactly the keys the kit selected, a planted off-by-one in them is caught; and its
declarations are vLLM's. Skipped, with the reason, only where the pinned vllm is not installed."""
from __future__ import annotations

import types

import pytest
import torch

from backends.vllm import sparse_mla
from backends.vllm.adapter import PROFILE, VllmBackend, model_of, runtime, vllm_problem
from backends.vllm.mla import VllmFlashMLABackend
from backends.vllm.sparse_mla import VllmFlashAttnMLASparseBackend, VllmFlashMLASparseBackend
from cases.mla import SMALL_MLA
from kit.engine.case import Case
from kit.engine.sparse import PAD
from kit.harness.protocol import BackendContext
from kit.modes import ForwardMode
from tests.helpers import run_setup

pytestmark = pytest.mark.skipif(vllm_problem() is not None, reason=str(vllm_problem()))

# vLLM's index conversion tiles a row by 128 (sparse_utils.py: NUM_TOPK_TOKENS % BLOCK_N == 0); DeepSeek-V3.2's
# top-k is 2048. Contexts past it, shorter ones, and 64-token blocks (FLASHMLA_SPARSE's).
TOPK = 128
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # vLLM's Triton kernels: on CPU, Triton's interpreter


def _case(mode, prefix, new, **kw) -> Case:
    fields = dict(dict(SMALL_MLA, index_topk=TOPK, page=64, dtype="bf16", layout="shuffled_pages"), **kw)
    return Case(name="s", mode=mode, prefix=prefix, new=new, **fields)


CASES = {
    # decode rows first, then a chunk with a cached prefix, then a fresh prompt (vLLM's reorder)
    "mixed": _case(ForwardMode.MIXED, (0, 300, 70, 129), (150, 1, 1, 1), index_scatter=True),
    "verify": _case(ForwardMode.TARGET_VERIFY, (200, 5, 127), 3),
    "extend_in_order": _case(ForwardMode.EXTEND, (64, 190), (3, 70), layout="contiguous"),
}


def _converted(batch, rows: torch.Tensor) -> torch.Tensor:
    """FLASHMLA_SPARSE's conversion of indexer rows into cache slots: per token its request by vLLM's
    own mapping (CommonAttentionMetadata.token_to_req_indices, the sparse builder's req_id_per_token),
    each position through the block table into a row of the cache's flat view (flat_kv_row_view over
    the cache as the adapter binds it), that row back to the pool's slot; -1 stays -1."""
    from vllm.v1.attention.backends.mla.sparse_utils import flat_kv_row_view, triton_convert_req_index_to_global_index

    common = VllmBackend.common_metadata(types.SimpleNamespace(rt=runtime()), batch.common)
    n = rows.shape[0]
    req_id = common.token_to_req_indices(torch.empty(n, dtype=torch.int32, device=rows.device))
    pool = batch.token_to_kv_pool
    page = pool.page_size
    storage = pool.layer_storage(1)[:, :page]  # as VllmFlashMLASparseBackend._cache_view binds it, head axis dropped
    _, stride_rows = flat_kv_row_view(storage, page)
    physical = triton_convert_req_index_to_global_index(req_id, common.block_table_tensor, rows.contiguous(),
                                                        BLOCK_SIZE=page, BLOCK_STRIDE_ROWS=stride_rows,
                                                        NUM_TOPK_TOKENS=rows.shape[1])
    assert stride_rows == page + 1  # the pool's gap between blocks is in the flat view's stride
    offset = physical % stride_rows
    assert bool((offset[physical >= 0] < page).all()), "a row converted into the gap between blocks"
    return torch.where(physical >= 0, physical // stride_rows * page + offset, PAD).cpu()


def _expected(plan) -> torch.Tensor:
    """The slots of the keys the kit selected, from the plan alone (each request's slot of each key
    column), in the batch's token order; PAD where the row has no index."""
    out = []
    for r in plan.requests:
        slots = torch.tensor(r.slots, dtype=torch.int64)
        out.append(torch.where(r.selected >= 0, slots[r.selected.clamp(min=0).long()], PAD))
    return torch.cat(out)


def _mismatches(case) -> int:
    fx = run_setup(case, backend_cls=VllmFlashMLASparseBackend, device=DEVICE).case_fixture
    batch = fx.batch
    rows = sparse_mla.indexer_rows(batch, batch.topk_indices.shape[0])
    return int((_converted(batch, rows) != _expected(fx.plan)).sum())


@pytest.mark.parametrize("name", CASES)
def test_the_indexer_rows_convert_to_the_slots_of_the_selected_keys(name):
    """What the adapter writes into the indexer's buffer, converted by vLLM as its sparse kernels'
    caller converts it, selects exactly the kit's keys: in vLLM's decode-first row order, through
    shuffled pages and the blocks' stride, -1 wherever the kit pads."""
    case = CASES[name]
    assert case.kind == "sparse_mla"
    assert _mismatches(case) == 0


def test_an_off_by_one_in_the_indexer_rows_is_caught(monkeypatch):
    """Planted: every index one position late (a request's positions counted from 1). The check
    above sees it."""
    original = sparse_mla.indexer_rows
    monkeypatch.setattr(sparse_mla, "indexer_rows",
                        lambda batch, n: torch.where(original(batch, n) >= 0, original(batch, n) + 1, PAD))
    assert _mismatches(CASES["mixed"]) > 0


def test_rows_handed_in_the_kits_order_not_vllms_are_caught(monkeypatch):
    """Planted: the rows in the step's scheduled order rather than the batch's (decode rows first).
    The check sees it: each row is judged against its own token's request."""
    original = sparse_mla.indexer_rows

    def scheduled(batch, n):
        rows = original(batch, n)
        return torch.cat([rows[3:], rows[:3]])  # the three decode rows moved behind the prefill chunks

    monkeypatch.setattr(sparse_mla, "indexer_rows", scheduled)
    assert _mismatches(CASES["mixed"]) > 0


def test_the_model_is_deepseek_v32s_with_the_cases_top_k():
    """The served config carries the case's index_topk (what vLLM's sparse builders read), the
    profile keeps the latent in strided blocks, and the declarations are vLLM's."""
    case = _case(ForwardMode.DECODE, (300, 5), 1, **dict(heads=(128, 1), head_dim=576, kv_lora_rank=512,
                                                            rope_dim=64, scale=0.07))
    config = VllmFlashMLASparseBackend.served_config(case)
    assert config.model_config.hf_text_config.index_topk == TOPK and model_of(case).index_topk == TOPK
    assert config.model_config.use_mla
    assert PROFILE.storage_for("sparse_mla") == "latent_strided_blocks"
    backend = VllmFlashMLASparseBackend.backend_cls()
    assert backend.is_sparse() and backend.get_name() == "FLASHMLA_SPARSE"
    assert VllmFlashMLASparseBackend.kv_dtypes == ()  # its fp8 is fp8_ds_mla, not the kit's per-layer scale
    assert VllmFlashMLASparseBackend.versions()["kv_write"] == VllmFlashMLABackend.versions()["kv_write"]


def test_vllms_own_refusals(monkeypatch):
    """On a Hopper GPU's answer: vLLM's validate_configuration takes DeepSeek's latent at 64-token
    blocks in bf16, sparse; refuses 16-token blocks, other dtypes, and the smoke set's small latent
    (vLLM's MLA takes its widths); no full graph of ragged batches (UNIFORM_BATCH). Without CUDA,
    everything reads the CPU's reason."""
    from vllm.platforms.interface import DeviceCapability

    rt = runtime()
    monkeypatch.setattr(rt.current_platform, "get_device_capability", lambda device_id=0: DeviceCapability(9, 0))
    deepseek = dict(heads=(128, 1), head_dim=576, kv_lora_rank=512, rope_dim=64, scale=0.07)
    decode = _case(ForwardMode.DECODE, (3000, 5), 1, **deepseek)
    assert VllmFlashMLASparseBackend._vllm_refuses(decode) is None
    assert "block_size not supported" in VllmFlashMLASparseBackend._vllm_refuses(decode.with_(page=16))
    assert "dtype not supported" in VllmFlashMLASparseBackend._vllm_refuses(decode.with_(dtype="fp16"))
    assert "[320, 512, 576]" in VllmFlashMLASparseBackend._refused(_case(ForwardMode.DECODE, (3,), 1))
    extend = _case(ForwardMode.EXTEND, (64, 0), (3, 200), **deepseek)
    assert VllmFlashMLASparseBackend._refused(extend) is None  # prefill rows run its top-k MQA kernel
    assert "UNIFORM_BATCH" in VllmFlashMLASparseBackend.supports_graph(extend)
    assert VllmFlashMLASparseBackend.supports_graph(decode) is None
    if not torch.cuda.is_available():
        for cls in (VllmFlashMLASparseBackend, VllmFlashAttnMLASparseBackend):
            assert "no CUDA device here" in cls.supports(decode)


@pytest.fixture
def host_built(monkeypatch):
    """Builds VllmFlashMLASparseBackend for a case where there is no GPU: the three CUDA-only calls
    of its construction answered (the SM count its builder sizes fp8 scheduler buffers by, the side
    stream and events its index group converts on, the allocator flush of workspace growth); all
    else is vLLM's own."""
    import vllm.v1.attention.backends.mla.flashmla_sparse as flashmla_sparse
    import vllm.v1.attention.backends.mla.index_group as index_group

    if not torch.cuda.is_available():
        monkeypatch.setattr(flashmla_sparse, "num_compute_units", lambda device_index: 132)
        monkeypatch.setattr(index_group, "_create_side_stream", lambda device: None)
        monkeypatch.setattr(index_group, "_create_event", lambda: None)
        monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)

    def build(case, cls=VllmFlashMLASparseBackend):
        fx = run_setup(case, backend_cls=cls, device=DEVICE).case_fixture
        fx.install()
        return fx, cls(BackendContext.for_case(case, fx.pools, fx.pools.token_to_kv_pool.device))

    return build


DEEPSEEK_MIXED = _case(ForwardMode.MIXED, (0, 200, 70, 129), (40, 1, 1, 1), heads=(4, 1), head_dim=576,
                       kv_lora_rank=512, rope_dim=64, scale=0.07)


def _reads_the_adapters_buffer(backend) -> bool:
    return all(attn.impl.topk_indices_buffer is backend.topk_indices_buffer for attn in backend.layers.values())


def test_vllms_sparse_layers_read_the_indexer_buffer_and_its_builder_splits_the_step(host_built):
    """vLLM's own layers and FlashMLASparseMetadataBuilder over a mixed step: every layer's impl reads
    the buffer the adapter fills, and the builder's metadata is the kit's step: the token -> request
    map of the batch's order, the block table, the decode rows first, the case's top-k."""
    fx, backend = host_built(DEEPSEEK_MIXED)
    assert _reads_the_adapters_buffer(backend)
    assert backend.topk_indices_buffer.shape[1] == TOPK
    backend.init_forward_metadata(fx.batch)
    requests = fx.plan.requests
    owner = torch.cat([torch.full((r.n_new,), i, dtype=torch.int32) for i, r in enumerate(requests)])
    for attn in backend.layers.values():
        metadata = backend.metadata[attn.layer_name]
        assert torch.equal(metadata.req_id_per_token[:owner.numel()].cpu(), owner)
        assert metadata.block_table is fx.batch.common.block_table
        assert metadata.topk_tokens == TOPK and metadata.block_size == 64
        assert metadata.num_decodes + metadata.num_prefills == len(requests)
        assert [r.n_new for r in requests[:3]] == [1, 1, 1]  # vLLM's order: the decode rows first


def test_a_layer_reading_another_buffer_is_caught(host_built, monkeypatch):
    """Planted: the layers built over a copy of the indexer's buffer (rows the adapter's copy never
    reaches). The identity check above sees it."""
    monkeypatch.setattr(VllmFlashMLASparseBackend, "_layer_args",
                        lambda self, layer: dict(use_sparse=True, topk_indices_buffer=self.topk_indices_buffer.clone()))
    _, backend = host_built(DEEPSEEK_MIXED)
    assert not _reads_the_adapters_buffer(backend)
