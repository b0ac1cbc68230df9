"""What the kit keeps across runs (kit.engine.fixture's batches, the pools' poison) is built once,
and never reused once something outside the kit changed it."""
import pytest
import torch

import kit.engine.fixture
import kit.engine.pools
import kit.engine.reference
from kit.engine.fingerprint import KitMemoryChanged
from kit.engine.fixture import Store, fixtures_for
from kit.process import budget
from kit.modes import ForwardMode
from kit.engine.pools import CASE_LAYER_ID
from kit.engine.profile import SGLANG
from tests.helpers import small_case

CASE = small_case("kept", ForwardMode.EXTEND, (5, 9), (3, 2))
OTHERS = [small_case(f"other{i}", ForwardMode.EXTEND, (4 + i,), (2,)) for i in range(kit.engine.fixture.SHARED_BATCHES + 2)]


STORE = Store(kept_bytes=lambda device: 1 << 30)


@pytest.fixture
def goldens(monkeypatch):
    """A fresh store (1 GiB of batches kept); the list of the float64 goldens computed from here on."""
    monkeypatch.setattr(STORE, "batches", kit.engine.fixture.SharedBatches())
    monkeypatch.setattr(STORE, "pools", kit.engine.pools.PoolCache())
    made, golden = [], kit.engine.reference.golden_lse
    monkeypatch.setattr(kit.engine.reference, "golden_lse",
                        lambda fx, *a, **k: made.append(fx.plan.case.name) or golden(fx, *a, **k))
    return made


def _fixture(case):
    return fixtures_for([case], "cpu", STORE, SGLANG)[0]


def _after_other_batches(case):
    for other in OTHERS:  # more batches than are kept past the budget
        _fixture(other)
    return _fixture(case)


def test_a_batch_is_built_once_for_every_backend(goldens):
    """The runs of a backend go case after case, then the next backend's: a batch is kept
    (within the budget) until the next backend runs it, and its references are not computed again."""
    first = _fixture(CASE)
    again = _after_other_batches(CASE)
    assert again.plan is first.plan and again.step.references is first.step.references
    assert goldens.count(CASE.name) == len(first.layers)


def test_past_the_budget_only_the_last_batches_are_kept(goldens, monkeypatch):
    monkeypatch.setattr(STORE, "kept_bytes", lambda device: 0)
    first = _fixture(CASE)
    assert _fixture(CASE).plan is first.plan  # the graph run after the eager run
    again = _after_other_batches(CASE)
    assert again.plan is not first.plan and goldens.count(CASE.name) == 2 * len(first.layers)


CHANGES = {
    "input": lambda fx: fx.inputs[CASE_LAYER_ID].k_old[0].add_(1),
    "golden": lambda fx: fx.step.references[CASE_LAYER_ID][0][-1].zero_(),
    "same-dtype reference": lambda fx: fx.step.references[0][1].mul_(2),
    "req_to_token table": lambda fx: next(iter(fx.tables.values()))[1][1, 0].add_(1),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_batch_changed_between_runs_is_built_again(goldens, change):
    """A stray write by one run into a batch the kit keeps (a graph replaying into freed
    buffers, say) must not reach the runs judged on it next: it is seen and rebuilt, with a warning."""
    first = _fixture(CASE)
    kept = {k: (g.clone(), s if s is None else s.clone()) for k, (g, s) in first.step.references.items()}
    table = next(iter(first.tables.values()))[1].clone()
    CHANGES[change](first)
    with pytest.warns(KitMemoryChanged, match="the batch kept"):
        again = _fixture(CASE)
    assert again.plan is not first.plan
    for k, (g, s) in kept.items():
        assert torch.equal(again.step.references[k][0].nan_to_num(), g.nan_to_num())
        assert s is None or torch.equal(again.step.references[k][1], s)
    assert torch.equal(next(iter(again.tables.values()))[1], table)


def test_what_a_run_reuses_is_checked_in_one_read_back(goldens, monkeypatch):
    """Kept batches and the pool's poison are compared to their fingerprints before a run, from one
    read back: each is a wait for the GPU, a switch between contexts when workers share it."""
    cases = [CASE, OTHERS[0], OTHERS[1]]
    fixtures_for(cases, "cpu", STORE, SGLANG)
    STORE.poison_suspect = True
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    again = fixtures_for(cases, "cpu", STORE, SGLANG)
    assert again[0].step.references and len(reads) == 1 and reads[0] == (len(cases) + 1,), reads


def test_a_fingerprint_copies_nothing():
    """Kept batches and the pool's poison are fingerprinted before every run: the sums must not copy
    them (bytes summed into int64 were copied to int64 first, 8 times the tensor)."""
    from torch.profiler import ProfilerActivity, profile

    from kit.engine.fingerprint import fingerprint
    big = torch.randn(1 << 20, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        sealed = fingerprint([big, big[:-1]])  # whole 32-bit words, and a last odd half word
    assert max(e.cpu_memory_usage for e in prof.key_averages()) < 1024
    changed = big.clone()
    changed[3] += 1
    assert not torch.equal(fingerprint([changed, big[:-1]]), sealed)


def test_changed_poison_is_drawn_again_where_a_stray_write_is_suspected(goldens, recwarn):
    """The pools' poison is compared to its fingerprint before a run that follows one that did not
    pass (it may have written outside its memory), and drawn again where it changed; after runs
    that passed it is not read at all (its cost would grow with the pool)."""
    kv = _fixture(CASE).pools.token_to_kv_pool
    poison = kv.poison.clone()
    kv.poison_v[CASE_LAYER_ID].zero_()
    _fixture(CASE)
    assert not recwarn.list  # nothing suspected: not compared
    STORE.poison_suspect = True
    with pytest.warns(KitMemoryChanged, match="poison"):
        _fixture(CASE)
    assert torch.equal(kv.poison, poison) and not STORE.poison_suspect


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the budget of a GPU shared by workers"))])
def test_the_budget_is_split_between_workers(monkeypatch, device):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    alone = budget.kept(torch.device(device))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "16")
    assert alone > 0 and budget.kept(torch.device(device)) == (alone // 16 if device == "cpu" else 0)


def test_a_kept_batch_is_counted_again_when_it_grows(goldens):
    """A kept batch gets the table of each pool it is installed in (a run of it beside a larger
    batch shares the larger one's pool): the budget counts it."""
    first = _fixture(CASE)
    big = small_case("big", ForwardMode.EXTEND, (4 * first.pools.token_to_kv_pool.size,), (2,))
    again = fixtures_for([big, CASE], "cpu", STORE, SGLANG)[1]
    assert len(again.tables) == 2
    shared = STORE.batches
    assert shared._kept_bytes == sum(s.nbytes for s in shared._kept.values())
