"""What the kit keeps across runs (kit.engine.fixture's batches, the pools' poison) is built once,
and never reused once something outside the kit changed it."""
import pytest
import torch

import kit.engine.fixture
import kit.engine.reference
from kit.engine.fingerprint import KitMemoryChanged
from kit.engine.fixture import fixtures_for
from kit.modes import ForwardMode
from kit.engine.pools import CASE_LAYER_ID
from tests.helpers import small_case

CASE = small_case("kept", ForwardMode.EXTEND, (5, 9), (3, 2))
OTHERS = [small_case(f"other{i}", ForwardMode.EXTEND, (4 + i,), (2,)) for i in range(kit.engine.fixture.SHARED_BATCHES + 2)]


@pytest.fixture
def goldens(monkeypatch):
    """A fresh batch cache; the list of the float64 goldens computed from here on."""
    monkeypatch.setattr(kit.engine.fixture, "SHARED", kit.engine.fixture._SharedBatches())
    made, golden = [], kit.engine.reference.golden
    monkeypatch.setattr(kit.engine.reference, "golden", lambda fx, *a, **k: made.append(fx.case.name) or golden(fx, *a, **k))
    return made


def _after_other_batches(case):
    for other in OTHERS:  # more batches than are kept past the budget
        fixtures_for([other], "cpu")
    return fixtures_for([case], "cpu")[0]


def test_a_batch_is_built_once_for_every_backend(goldens):
    """The runs of a backend go case after case, then the next backend's: a batch is kept
    (within the budget) until the next backend runs it, and its references are not computed again."""
    first = fixtures_for([CASE], "cpu")[0]
    again = _after_other_batches(CASE)
    assert again.plan is first.plan and again.references is first.references
    assert goldens.count(CASE.name) == len(first.layers)


def test_past_the_budget_only_the_last_batches_are_kept(goldens, monkeypatch):
    monkeypatch.setattr(kit.engine.fixture, "_budget", lambda device: 0)
    first = fixtures_for([CASE], "cpu")[0]
    assert fixtures_for([CASE], "cpu")[0].plan is first.plan  # the graph run after the eager run
    again = _after_other_batches(CASE)
    assert again.plan is not first.plan and goldens.count(CASE.name) == 2 * len(first.layers)


CHANGES = {
    "input": lambda fx: fx.inputs[CASE_LAYER_ID].k_old[0].add_(1),
    "golden": lambda fx: fx.references[CASE_LAYER_ID][0][-1].zero_(),
    "same-dtype reference": lambda fx: fx.references[0][1].mul_(2),
    "req_to_token table": lambda fx: next(iter(fx.tables.values()))[1][1, 0].add_(1),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_batch_changed_between_runs_is_built_again(goldens, change):
    """A stray write by one run into a batch the kit keeps (a graph replaying into freed
    buffers, say) must not reach the runs judged on it next: it is seen and rebuilt, with a warning."""
    first = fixtures_for([CASE], "cpu")[0]
    kept = {k: (g.clone(), s.clone()) for k, (g, s) in first.references.items()}
    table = next(iter(first.tables.values()))[1].clone()
    CHANGES[change](first)
    with pytest.warns(KitMemoryChanged, match="the batch kept"):
        again = fixtures_for([CASE], "cpu")[0]
    assert again.plan is not first.plan
    for k, (g, s) in kept.items():
        assert torch.equal(again.references[k][0].nan_to_num(), g.nan_to_num())
        assert torch.equal(again.references[k][1], s)
    assert torch.equal(next(iter(again.tables.values()))[1], table)


def test_what_a_run_reuses_is_checked_in_one_read_back(goldens, monkeypatch):
    """Kept batches and the pool's poison are compared to their fingerprints before a run, from one
    read back: each is a wait for the GPU, a switch between contexts when workers share it."""
    cases = [CASE, OTHERS[0], OTHERS[1]]
    fixtures_for(cases, "cpu")
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real(t))
    again = fixtures_for(cases, "cpu")
    assert again[0].references is not None and len(reads) == 1, reads


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


def test_changed_poison_is_drawn_again(goldens):
    kv = fixtures_for([CASE], "cpu")[0].pools.token_to_kv_pool
    poison = [p.clone() for p in kv._poison_v]
    kv._poison_v[CASE_LAYER_ID].zero_()
    with pytest.warns(KitMemoryChanged, match="poison"):
        fixtures_for([CASE], "cpu")
    assert all(torch.equal(a, b) for a, b in zip(kv._poison_v, poison))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the budget of a GPU shared by workers"))])
def test_the_budget_is_split_between_workers(monkeypatch, device):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    alone = kit.engine.fixture._budget(torch.device(device))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "16")
    assert alone > 0 and kit.engine.fixture._budget(torch.device(device)) == (alone // 16 if device == "cpu" else 0)


def test_a_kept_batch_is_counted_again_when_it_grows(goldens):
    """A kept batch gets the table of each larger pool it is installed in: the budget counts it."""
    first = fixtures_for([CASE], "cpu")[0]
    big = small_case("big", ForwardMode.EXTEND, (4 * first.pools.token_to_kv_pool.size,), (2,))
    fixtures_for([big], "cpu")  # the pool grows
    again = fixtures_for([CASE], "cpu")[0]
    assert len(again.tables) == 2
    shared = kit.engine.fixture.SHARED
    assert shared._kept_bytes == sum(s.nbytes for s in shared._kept.values())
