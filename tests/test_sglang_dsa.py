"""The SGLang adapter's DSA side on CPU, where DeepseekSparseAttnBackend's kernels do not run (and its
constructor asks CUDA for the device's compute capability): the top-k rows it hands the backend,
mapped to KV slots by SGLang's own unfused conversion (transform_index.py's Triton kernels, in
Triton's interpreter) over the page table SGLang's DSA metadata builds, land on the keys the kit's
indexer selected, in every mode it serves; a rendering off by one is caught; the reasons it gives
where SGLang's DSA path is not the one the kit calls; and a prefill graph's metadata and forward run
inside SGLang's breakable-graph context, where the real backend's dispatch keeps a short batch
sparse. Skipped, with the reason, only where the pinned sglang is not installed (CI installs it)."""
import pytest
import torch

from backends.sglang.adapter import sglang_problem
from backends.sglang.dsa import SGLangDSABackend, SGLangDSATritonBackend
from kit.engine.case import Case
from kit.engine.sparse import PAD
from kit.harness.runner import default_device
from kit.modes import ForwardMode
from tests.helpers import make_fixture

pytestmark = pytest.mark.skipif(sglang_problem() is not None, reason=str(sglang_problem()))

DEVICE = default_device()  # the conversion kernels: Triton's interpreter on CPU, compiled on CUDA

MODES = SGLangDSABackend.modes
# Width 6, not the engine's 2048: the width-generic (tiled) kernels; contexts below and past it.
SPARSE = dict(heads=(4, 1), head_dim=24, kv_lora_rank=16, rope_dim=8, scale=0.3, index_topk=6, dtype="fp32")
NEW = {ForwardMode.DECODE: 1, ForwardMode.EXTEND: (5, 9, 4), ForwardMode.MIXED: (5, 9, 1), ForwardMode.TARGET_VERIFY: 3}


def _case(mode, **kw):
    return Case("smla", mode, prefix=(0, 3, 40) if mode is not ForwardMode.DECODE else (2, 3, 40), new=NEW[mode],
                page=4, layout="shuffled_pages", **dict(SPARSE, **kw))


def _slots_by_sglang(batch, rendered: torch.Tensor) -> torch.Tensor:
    """KV slots of the rendered rows as SGLang's unfused path maps them: its page table (one row per
    request, [req_to_token row][:max_seqlen_k]; per query token in a verify, dsa_backend.py
    init_forward_metadata) through transform_index_page_table_decode (forward_decode) or _prefill
    (forward_extend, per request's extend length; expanded rows in a verify)."""
    from backends.sglang import runtime  # noqa: F401  SGLang set up (Triton's interpreter on CPU)
    from sglang.kernels.ops.attention.dsa.transform_index import (transform_index_page_table_decode,
                                                                   transform_index_page_table_prefill)

    mode, bs = batch.forward_mode, batch.batch_size
    r2t, rows = batch.req_to_token_pool.req_to_token, batch.req_pool_indices[:bs].long()
    if mode is ForwardMode.DECODE:
        table = r2t[rows, :int(batch.seq_lens[:bs].max())]
        return transform_index_page_table_decode(page_table=table, topk_indices=rendered, page_size=1)
    if mode is ForwardMode.TARGET_VERIFY:
        drafts = batch.spec_info.draft_token_num
        table = r2t[rows, :int(batch.seq_lens[:bs].max()) + drafts].repeat_interleave(drafts, dim=0)
        return transform_index_page_table_prefill(page_table=table, topk_indices=rendered, extend_lens_cpu=[drafts] * bs,
                                                  page_size=1, page_table_is_expanded=True)
    table = r2t[rows, :int(batch.seq_lens[:bs].max())]
    return transform_index_page_table_prefill(page_table=table, topk_indices=rendered,
                                              extend_lens_cpu=list(batch.extend_seq_lens_cpu[:bs]), page_size=1)


def _selected_slots(fx) -> torch.Tensor:
    """The slots of the keys the kit's indexer selected: per query token its request's req_to_token
    entry at each selected position, PAD kept."""
    r2t = fx.batch.req_to_token_pool.req_to_token
    rows = torch.cat([torch.full((r.n_new,), int(i), dtype=torch.long)
                      for r, i in zip(fx.plan.requests, fx.batch.req_pool_indices.tolist())]).to(r2t.device)
    selected = torch.cat([r.selected for r in fx.plan.requests]).long().to(r2t.device)
    slots = r2t[rows[:, None], selected.clamp(min=0)]
    return torch.where(selected == PAD, PAD, slots).to(torch.int32)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_sglangs_own_conversion_lands_the_rendered_rows_on_the_selected_keys(mode):
    fx = make_fixture(_case(mode), DEVICE)
    rendered = SGLangDSABackend.topk_indices(fx.batch, fx.batch.num_tokens)
    assert rendered.dtype == torch.int32 and rendered.is_contiguous()
    assert torch.equal(_slots_by_sglang(fx.batch, rendered), _selected_slots(fx))


@pytest.mark.parametrize("mode", (ForwardMode.DECODE, ForwardMode.EXTEND), ids=lambda m: m.value)
def test_a_rendering_off_by_one_is_caught(mode, monkeypatch):
    """The check above sees a row rendered one position late (each index + 1, padding kept)."""
    real = SGLangDSABackend.topk_indices

    def late(batch, num_tokens):
        rows = real(batch, num_tokens)
        return torch.where(rows == PAD, rows, rows + 1)
    monkeypatch.setattr(SGLangDSABackend, "topk_indices", staticmethod(late))
    fx = make_fixture(_case(mode), DEVICE)
    rendered = SGLangDSABackend.topk_indices(fx.batch, fx.batch.num_tokens)
    assert not torch.equal(_slots_by_sglang(fx.batch, rendered), _selected_slots(fx))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reason without CUDA; this machine has it")
def test_on_cpu_it_names_the_cuda_it_needs():
    reason = SGLangDSABackend.supports(_case(ForwardMode.DECODE))
    assert "CUDA only" in reason and "get_device_capability" in reason


@pytest.fixture
def hopper(monkeypatch):
    """A CUDA device of compute capability 9.0, as the reasons read it, with the packages it imports."""
    from backends.sglang import dsa

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(dsa, "_load_problem", lambda package: None)
    return dsa


V32 = dict(heads=(128, 1), head_dim=576, kv_lora_rank=512, rope_dim=64, scale=0.1, index_topk=2048, dtype="bf16")


def _v32(mode, prefix=(3000, 63), new=None, **kw):
    new = new or {ForwardMode.EXTEND: (2100, 20), ForwardMode.MIXED: (2100, 1)}.get(mode, NEW[mode])
    return Case("smla", mode, prefix=prefix, new=new, page=64, **dict(V32, **kw))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_deepseek_v32_runs_in_every_mode_on_hopper(mode, hopper):
    assert SGLangDSABackend.supports(_v32(mode)) is None


@pytest.mark.parametrize("fields, says", [
    (dict(index_scatter=True), "tail-padded with -1"),
    (dict(dtype="fp16"), "bf16 q and KV only"),
    (dict(heads=(48, 1)), "64 or 128"),
], ids=["scattered_padding", "fp16", "heads48"])
def test_what_sglangs_dsa_path_does_not_take_is_named(fields, says, hopper):
    assert says in SGLangDSABackend.supports(_v32(ForwardMode.DECODE, **fields))


@pytest.mark.parametrize("mode", (ForwardMode.EXTEND, ForwardMode.MIXED), ids=lambda m: m.value)
def test_a_short_prefill_is_sglangs_dense_path_not_the_sparse_one(mode, hopper):
    """At most 2048 tokens a sequence SGLang prefills dense on SM90 (MHA_ONE_SHOT); past it, sparse."""
    assert "MHA_ONE_SHOT" in SGLangDSABackend.supports(_v32(mode, prefix=(100, 7), new=(1948, 1)))
    assert SGLangDSABackend.supports(_v32(mode, prefix=(100, 7), new=(1949, 1))) is None


def test_a_missing_kernel_package_is_named(hopper, monkeypatch):
    monkeypatch.setattr(hopper, "_load_problem",
                        lambda package: f"{package} is not installed" if package == hopper.DEEP_GEMM else None)
    assert "deep_gemm is not installed" in SGLangDSABackend.supports(_v32(ForwardMode.DECODE))
    assert SGLangDSABackend.supports(_v32(ForwardMode.EXTEND)) is None  # the prefill builds no indexer schedule


@pytest.mark.parametrize("mode", SGLangDSATritonBackend.modes, ids=lambda m: m.value)
def test_the_triton_prefill_takes_up_to_32_heads(mode, hopper):
    assert SGLangDSATritonBackend.supports(_v32(mode, heads=(32, 1))) is None
    assert "up to 32" in SGLangDSATritonBackend.supports(_v32(mode))  # 128 heads


def test_the_triton_prefill_needs_hopper_and_no_flash_mla(hopper, monkeypatch):
    monkeypatch.setattr(hopper, "_load_problem", lambda package: f"{package} is not installed")
    case = _v32(ForwardMode.EXTEND, heads=(32, 1))
    assert SGLangDSATritonBackend.supports(case) is None
    assert "flash_mla is not installed" in SGLangDSABackend.supports(case)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "SM90" in SGLangDSATritonBackend.supports(case)


@pytest.mark.parametrize("cls", (SGLangDSABackend, SGLangDSATritonBackend), ids=lambda c: c.name)
def test_the_full_set_has_cases_each_backend_runs_on_hopper_in_each_of_its_modes(cls, hopper):
    from kit.engine.catalog import load_catalog

    catalog = load_catalog()
    for mode in cls.modes:
        assert any(cls.supports(c) is None for c in catalog.cases("full", mode) if c.index_topk), mode


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_a_prefill_graph_hands_the_fields_of_its_requests_alone(mode):
    """A token graph's batch may hold its per-request fields at full capacity (stale rows past its
    requests); SGLang's prefill graph runner hands attention the real batch's (the DSA backend zips
    seq_lens_cpu with extend_seq_lens_cpu, strictly, and plans over every row of the device ones)."""
    import dataclasses

    from backends.sglang.adapter import REQUEST_FIELDS, prefill_runner_view

    batch = make_fixture(_case(mode), DEVICE).batch
    stale = lambda t: t if not torch.is_tensor(t) else torch.cat([t, t[:1].repeat(3)])  # noqa: E731  3 rows past
    graph = dataclasses.replace(batch, **{n: stale(getattr(batch, n)) for n in REQUEST_FIELDS
                                          if getattr(batch, n) is not None})
    view = prefill_runner_view(graph)
    if mode not in (ForwardMode.EXTEND, ForwardMode.MIXED):
        assert view is graph  # a decode-shaped graph's padded requests are SGLang's too
        return
    for name in REQUEST_FIELDS:
        real, seen = getattr(batch, name), getattr(view, name)
        assert (seen is None) if real is None else (list(seen) == list(real)), name
    assert view.seq_lens_sum == batch.seq_lens_sum


class _AttentionReached(Exception):
    """Raised where SGLang's DSA forward_extend would run its kernels, which need CUDA."""


@pytest.mark.parametrize("mode", (ForwardMode.EXTEND, ForwardMode.MIXED), ids=lambda m: m.value)
def test_a_prefill_graph_runs_in_sglangs_breakable_graph_context(mode, monkeypatch):
    """SGLang's prefill graph runner holds enable_breakable_cuda_graph() over the metadata and the
    forward, at capture and at every replay, and DSA's dispatch reads it: on an H200, a batch whose
    sequences hold at most 2048 keys is dense (MHA_ONE_SHOT) eagerly, sparse in a graph, where the
    dense path would assert on the absorbed call's q_rope (dsa_backend.py forward_extend). The real
    backend and SGLang's real dispatch, on CPU too; the device reads as an H200 (SM 9.0)."""
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import is_in_breakable_cuda_graph

    from kit.harness.hooks import driver_for
    from kit.modes import Exec
    from tests.helpers import run_setup

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))  # the constructor asks
    setup = run_setup(_case(mode, dtype="bf16"), Exec.GRAPH, DEVICE, SGLangDSABackend)
    backend = setup.new_backend()
    backend.impl._get_device_sm = lambda: 90  # as __init__ hoists SGLang's reader, asked per batch
    fx = setup.case_fixture
    fx.install()
    layer, inputs = fx.layers[0], fx.inputs[0]
    seen = []

    def forward_extend(*args, **kwargs):
        seen.append((backend.impl.use_mha, is_in_breakable_cuda_graph()))
        raise _AttentionReached

    monkeypatch.setattr(backend.impl, "forward_extend", forward_extend)

    def dispatched(prepare) -> tuple:
        """(dense, inside SGLang's breakable graph) as forward_extend sees them after `prepare`."""
        prepare()
        with pytest.raises(_AttentionReached):
            backend.forward(inputs.q, inputs.k_new, inputs.v_new, layer, fx.batch)
        return seen.pop()

    hooks = driver_for(backend, setup.caps)  # as the harness drives them: eager, a token graph's capture, replay
    assert dispatched(lambda: hooks.eager(fx.batch)) == (True, False)
    assert dispatched(lambda: hooks.ragged(fx.batch, fx.plan, in_capture=True)) == (False, True)
    assert dispatched(lambda: hooks.ragged(fx.batch, fx.plan)) == (False, True)
    assert dispatched(lambda: hooks.eager(fx.batch)) == (True, False)  # eager again after a graph
    assert not is_in_breakable_cuda_graph()
