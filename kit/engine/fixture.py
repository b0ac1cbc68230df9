"""A plan made concrete: a step program over poisoned pools.

A fixture is one batch of a run: its plan (the step description: the requests, as the metadata
hooks see them), the batch object the metadata hooks get (rendered from the plan by the converter
of the backend's profile, kit.engine.render), and its steps: the forwards the batch is made of, in order,
each with the batch object forward() gets, the requests as the reference sees them and their
inputs per layer. Every mode but a multi-step one has a single step, the batch itself; a
multi-step mode's rules derive its steps (kit.engine.modes.rules.ModeRules.steps), each reading
the KV the ones before it wrote.

What a batch case determines and no backend can change (plans, model, inputs, the references
computed from them, the req_to_token table) is built once per process and shared by every run of
that batch (`_Shared`, kept in a `Store`): the same batch is run by every backend and, for the
case itself, by eager and graph runs. Before each reuse its fingerprint is compared
(kit.engine.fingerprint): a stray write by an earlier run is not judged against. What a backend
can write is never shared: each run gets its own batch objects, the pool is installed before
every program, and forward() is handed copies of the inputs (kit.harness.runner). How long what
is kept lives is the process's policy (kit.process.memory), handed in as the Store.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from kit import spend
from kit.engine.batch import ForwardBatch
from kit.engine.case import Case
from kit.engine.fingerprint import fingerprint, unchanged
from kit.engine.inputs import LayerInputs, gather, streams
from kit.engine.layer import Layer, model_layers
from kit.engine.modes import rules_for
from kit.engine.plan import BatchPlan, plan_case
from kit.engine.numerics import EXACT_NUMERICS, Numerics
from kit.engine.pools import CASE_LAYER_ID, PoolCache, Pools, PoolSpec
from kit.engine.profile import AS_SCHEDULED, EngineProfile
from kit.engine import reference_cache
from kit.engine.reference import declared, logical_kv, lse_key, references
from kit.engine.render import render, step_views
from kit.engine.storage import storage
from kit.engine.transfer import to_device

# Batches kept built past the budget: one run's (at most 6) and more, so that a case's graph run
# finds the batch its eager run built (kit.plugin.selection orders them so).
SHARED_BATCHES = 8


@dataclasses.dataclass
class Step:
    """One forward of a fixture's program: what forward() gets, the requests as the reference sees
    them, and their inputs per layer (layer_id = index)."""

    index: int
    plan: BatchPlan
    batch: ForwardBatch
    layers: Tuple[Layer, ...]
    inputs: List[LayerInputs]
    # Per layer id, the (float64 golden, same-dtype) references, shared by every run of the batch; per
    # (declared numerics' steps, layer id), their (emulated, envelope) references (Step.declared); the
    # log-sum-exps of either under kit.engine.reference.lse_key (Step.lse).
    references: Dict[object, Tuple[torch.Tensor, Optional[torch.Tensor]]] = dataclasses.field(default_factory=dict,
                                                                                             repr=False)

    @property
    def case(self) -> Case:
        return self.plan.case

    def reference(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if layer_id not in self.references:
            with spend.timed(spend.REFERENCE):
                self.references.update(reference_cache.kept(self, "exact", lambda: references(self)))
        return self.references[layer_id]

    def declared(self, layer_id: int, steps: Tuple[str, ...]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(emulated, envelope) float64 references of one layer under declared numerics' `steps`
        (kit.engine.reference.declared), computed once per batch and steps."""
        if (steps, layer_id) not in self.references:
            with spend.timed(spend.REFERENCE):
                refs = reference_cache.kept(self, ("declared", steps), lambda: declared(self, steps))
                self.references.update(((steps, lid), pair) for lid, pair in refs.items())
        return self.references[(steps, layer_id)]

    def lse(self, layer_id: int, steps: Tuple[str, ...] = ()) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(float64 log-sum-exp, that of the envelope or None) of one layer: the golden's, or under
        declared numerics' `steps` the emulation's; computed by the same pass as the outputs."""
        if not steps:
            self.reference(layer_id)
            return self.references[lse_key(layer_id)]
        self.declared(layer_id, steps)
        return self.references[(steps, lse_key(layer_id))]

    def logical_kv(self, layer_id: int = CASE_LAYER_ID) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per request, K and V of every logical token of a layer in order (cached, then new)."""
        return logical_kv(self.plan, self.inputs[layer_id])


@dataclasses.dataclass
class Fixture:
    plan: BatchPlan  # the requests, as the metadata hooks see them
    pools: Pools
    layers: Tuple[Layer, ...]  # the model, in layer order (layer_id = index)
    batch: ForwardBatch  # what the metadata hooks get
    steps: List[Step]  # the forwards, in order
    program_inputs: List[LayerInputs]  # per layer, the plan's requests' inputs (their cached tokens installed)
    # Per pool size, what install() copies in (Fixture._installed), shared with every run of the batch.
    tables: Dict[tuple, tuple] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def case(self) -> Case:
        return self.plan.case

    @property
    def step(self) -> Step:
        """The only step of a single-step program."""
        if len(self.steps) != 1:
            raise ValueError(f"{self.case.name}: a program of {len(self.steps)} steps; name the step")
        return self.steps[0]

    # The only step's inputs, and those of the case's own layer, which most checks and tests read.
    @property
    def inputs(self) -> List[LayerInputs]:
        return self.step.inputs

    @property
    def q(self) -> torch.Tensor:
        return self.inputs[CASE_LAYER_ID].q

    @property
    def k_new(self) -> torch.Tensor:
        return self.inputs[CASE_LAYER_ID].k_new

    @property
    def v_new(self) -> torch.Tensor:
        return self.inputs[CASE_LAYER_ID].v_new

    def reference(self, layer_id: int, step: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """(float64 golden, same-dtype reference) of one layer of one step: computed once per batch
        and process (shared by every run of the batch), never by a run (fixtures_for computes
        them before a backend is made)."""
        return self.steps[step].reference(layer_id)

    def logical_kv(self, layer_id: int = CASE_LAYER_ID) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per request, K and V of every logical token of a layer in order (cached, then new)."""
        return logical_kv(self.plan, self.program_inputs[layer_id])

    def install(self) -> None:
        """Write this fixture into the (shared, reused) pools, in place: poison everywhere, then the
        cached tokens' K/V and the requests' req_to_token rows."""
        kv, r2t = self.pools.token_to_kv_pool, self.pools.req_to_token_pool.req_to_token
        kv.reset()
        old_slots, table = self._installed(kv, r2t)
        if old_slots is not None:
            for layer_id, (k_old, v_old) in enumerate(self.installed_kv()):
                kv.write(layer_id, old_slots, k_old, v_old)
        r2t.copy_(table)

    def installed_kv(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the cached tokens' K and V as the pool stores them (in old_slots order)."""
        kv = self.pools.token_to_kv_pool
        return [kv.stored(layer_id, x.k_old, x.v_old) for layer_id, x in enumerate(self.program_inputs)]

    def old_slots(self) -> Optional[torch.Tensor]:
        """The cached tokens' slots (install() writes them), or None where there are none."""
        kv = self.pools.token_to_kv_pool
        return self._installed(kv, self.pools.req_to_token_pool.req_to_token)[0]

    def _installed(self, kv, r2t) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        return installed(self.plan, self.tables, kv, r2t)


def installed(plan: BatchPlan, tables: Dict[tuple, tuple], kv, r2t) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """(slots of the cached tokens, the req_to_token table) of `plan` for pools of this size: built
    once per batch and pool size (kept in `tables`, shared like the references), copied in by
    Fixture.install()."""
    key = (kv.size, tuple(r2t.shape))
    if key not in tables:
        device = kv.device
        gen = torch.Generator(device=device).manual_seed(plan.case.rng_seed(1))
        old = [s for r in plan.requests for s in r.slots[:r.n_old]]
        old_slots = to_device(old, device, torch.int64) if old else None
        # Every req_to_token entry that is not a real token points at an unowned
        # (poisoned) slot, so reading past seq_len shows in the output.
        owned = torch.zeros(kv.size, dtype=torch.bool)
        owned[0] = True
        owned[[s for r in plan.requests for s in r.slots]] = True
        unowned = to_device((~owned).nonzero().squeeze(1), device, torch.int32)
        table = unowned[torch.randint(0, unowned.numel(), tuple(r2t.shape), generator=gen, device=device)]
        table[0].zero_()
        rows = [r.row for r in plan.requests for _ in range(r.total)]
        cols = [t for r in plan.requests for t in range(r.total)]
        slots = [s for r in plan.requests for s in r.slots]
        table[to_device(rows, device), to_device(cols, device)] = to_device(slots, device, torch.int32)
        tables[key] = (old_slots, table)
    return tables[key]


@dataclasses.dataclass
class _Shared:
    """What a batch case determines, without pools: shared by the fixtures of every run of it."""

    plan: BatchPlan
    layers: Tuple[Layer, ...]
    program_inputs: List[LayerInputs]  # never handed to a backend (kit.harness.runner hands copies)
    step_plans: List[BatchPlan]
    step_inputs: List[List[LayerInputs]]  # per step, per layer
    references: List[Dict[int, Tuple[torch.Tensor, torch.Tensor]]]  # per step
    tables: Dict[tuple, tuple]
    sealed: Optional[torch.Tensor] = None  # fingerprint of tensors(), once complete
    counted: int = 0  # bytes counted against the budget, while kept

    def tensors(self) -> List[torch.Tensor]:
        held = [t for x in self.program_inputs for t in x.owned()]
        held += [t for inputs in self.step_inputs if inputs is not self.program_inputs for x in inputs for t in x.owned()]
        held += [t for refs in self.references for pair in refs.values() for t in pair if t is not None]
        return held + [t for pair in self.tables.values() for t in pair if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _build(case: Case, device: torch.device, order: str) -> _Shared:
    plan, layers = plan_case(case, order), model_layers(case)
    drawn = streams(plan, layers, case.torch_dtype, device)
    program = [gather(plan, per_layer) for per_layer in drawn]
    step_plans = rules_for(case.mode).steps(plan)
    step_inputs = [program if p is plan else [gather(p, per_layer) for per_layer in drawn] for p in step_plans]
    return _Shared(plan, layers, program, step_plans, step_inputs, [{} for _ in step_plans], {})


class SharedBatches:
    """Batches built, by everything that determines them: the batch case (every field, the
    layer config included; its repr, as a catalog may give lists), the engine's row order
    (kit.engine.profile.ROW_ORDERS) and the device. The runs
    of a backend go case after case, then the next backend's (kit.plugin.selection): each
    batch is kept while the budget lasts (Store.kept_bytes), so that every backend is judged on
    it as built once; past the budget, the last SHARED_BATCHES are."""

    def __init__(self):
        self._kept: Dict[Tuple[str, str, str], _Shared] = {}
        self._kept_bytes = 0
        self._recent: "collections.OrderedDict[Tuple[str, str, str], _Shared]" = collections.OrderedDict()

    def get(self, case: Case, device: torch.device, order: str = AS_SCHEDULED) -> _Shared:
        """The batch as kept, unchecked (fixtures_for checks it), else built."""
        key = (repr(case), order, str(device))
        shared = self._kept.get(key) or self._recent.get(key)
        if shared is not None:
            if key in self._recent:
                self._recent.move_to_end(key)
            return shared
        shared = _build(case, device, order)
        self._recent[key] = shared
        while len(self._recent) > SHARED_BATCHES:
            self._recent.popitem(last=False)
        return shared

    def clear(self) -> None:
        self._kept.clear()
        self._kept_bytes = 0
        self._recent.clear()

    def forget(self, case: Case, device: torch.device, order: str = AS_SCHEDULED) -> None:
        """Changed behind the kit's back: built again by the next get()."""
        key = (repr(case), order, str(device))
        shared = self._kept.pop(key, None)
        if shared is not None:
            self._kept_bytes -= shared.counted
        self._recent.pop(key, None)

    def seal(self, case: Case, device: torch.device, shared: _Shared, budget: int, order: str = AS_SCHEDULED) -> None:
        """`shared` is complete (references, the table of this run's pool): fingerprinted, and
        kept if `budget` (bytes of batches kept in all) allows."""
        shared.sealed = fingerprint(shared.tensors())
        key = (repr(case), order, str(device))
        if key in self._kept:  # grown while kept (the table of a larger pool): counted again
            self._kept_bytes -= shared.counted
        elif key in self._recent and self._kept_bytes + shared.nbytes <= budget:
            self._kept[key] = self._recent.pop(key)
        else:
            return
        shared.counted = shared.nbytes
        self._kept_bytes += shared.counted


@dataclasses.dataclass
class Store:
    """What fixtures are built in and kept in between runs, and the policy that bounds it (the
    process's: kit.process.memory): bytes of batches kept for every backend, bytes free on the
    device now, and how to let go of everything kept before a large allocation."""

    batches: SharedBatches = dataclasses.field(default_factory=SharedBatches)
    pools: PoolCache = dataclasses.field(default_factory=PoolCache)
    kept_bytes: Callable[[torch.device], int] = lambda device: 0
    free_bytes: Callable[[torch.device], int] = lambda device: 1 << 62
    release: Optional[Callable[[], None]] = None  # None: clear this store's caches
    # A run since the pools' poison was last checked may have written outside its memory (it did
    # not pass): the poison's fingerprint is compared before the next run.
    poison_suspect: bool = False

    def let_go(self) -> None:
        if self.release is not None:
            self.release()
        else:
            self.batches.clear()
            self.pools.clear()


def _pools_for(plans: Sequence[BatchPlan], first: Case, device: torch.device, store: Store,
               profile: EngineProfile) -> Pools:
    """The (cached) pools of the size class of every plan, in the engine's storage layout, the
    page size set to the case's. A new pool larger than what is free on the device now is made
    after the store let go of what it keeps."""
    spec = PoolSpec(num_slots=max(p.num_slots for p in plans), max_reqs=max(p.max_reqs for p in plans),
                    max_context=max(p.max_context for p in plans), geometry=first.geometry,
                    storage=storage(profile.storage_for(first.kind)), block=first.page,
                    dtype=first.kv_torch_dtype, device=str(device))
    new = store.pools.new_bytes(spec)
    if new and new > store.free_bytes(device):  # a driver query, only for a pool not cached
        store.let_go()
    pools = store.pools.get(spec)
    pools.token_to_kv_pool.page_size = first.page
    return pools


DEFAULT_STORE = Store()


def fixtures_for(cases: Sequence[Case], device, store: Optional[Store], profile: EngineProfile,
                 numerics: Numerics = EXACT_NUMERICS) -> List[Fixture]:
    """Fixtures for `cases` (one run: the same page size and layer config), their rows in the order
    the engine's profile hands them, sharing one (cached) pool big enough for all of them, in the
    storage layout of the engine's profile: a graph's replays must all read the pool it was
    captured against. The pool's page size is set here,
    once per run; each fixture's batch objects are its own; call install() before each program.
    Everything shared (references, the pool's req_to_token table) is complete before a backend
    is made; with the backend's declared `numerics`, their references too."""
    device, store = torch.device(device), store or DEFAULT_STORE
    order = profile.row_order
    shared = [store.batches.get(c, device, order) for c in cases]
    pools = _pools_for([s.plan for s in shared], cases[0], device, store, profile)
    kv = pools.token_to_kv_pool
    # What this run reuses (kept batches; the pool's poison where a stray write is suspected)
    # against its fingerprint, in one read back.
    reused = [i for i, s in enumerate(shared) if s.sealed is not None]  # unsealed: a run failed building it
    checked = [(shared[i].sealed, shared[i].tensors(), f"the batch {cases[i].name}") for i in reused]
    suspect, store.poison_suspect = store.poison_suspect, False
    kept = unchanged(checked + ([kv.sealed_poison()] if suspect else []))
    for i, ok in zip(reused, kept):
        if not ok:
            store.batches.forget(cases[i], device, order)
            shared[i] = store.batches.get(cases[i], device, order)
    if suspect and not kept[-1]:
        kv.draw_poison()
    fixtures = []
    for case, s in zip(cases, shared):
        held = len(s.tensors())
        _, table = installed(s.plan, s.tables, kv, pools.req_to_token_pool.req_to_token)
        batch = render(s.plan, pools, table, device, profile)
        steps = [Step(i, p, view, s.layers, inputs, refs) for i, (p, view, inputs, refs) in enumerate(
            zip(s.step_plans, step_views(batch, s.step_plans), s.step_inputs, s.references))]
        fx = Fixture(plan=s.plan, pools=pools, layers=s.layers, batch=batch, steps=steps,
                     program_inputs=s.program_inputs)
        fx.tables = s.tables
        taken = numerics.case_steps(case, device.type)
        for step in steps:
            step.reference(CASE_LAYER_ID)
            if taken:
                step.declared(CASE_LAYER_ID, taken)
        if s.sealed is None or len(s.tensors()) != held:
            store.batches.seal(case, device, s, store.kept_bytes(device), order)
        fixtures.append(fx)
    return fixtures
