"""A plan made concrete: random q/k/v, poisoned pools, and the batch object.

What a batch case determines and no backend can change (plan, model, inputs, the
references computed from them, the req_to_token table) is built once per process
and shared by every run of that batch (`_Shared`, SHARED): the same batch is run by
every backend and, for the case itself, by eager and graph runs. Before each reuse
its fingerprint is compared (kit.engine.fingerprint): a stray write by an earlier run is
not judged against. What a backend can write is never shared: each run gets its
own batch object, the pools are re-installed before every step, and forward() is
handed copies of the inputs (kit.harness.runner).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from kit.process import budget
from kit.engine.batch import ForwardBatch
from kit.engine.case import Case
from kit.engine.fingerprint import fingerprint, unchanged
from kit.engine.layer import Layer, model_layers
from kit.engine.modes import rules_for
from kit.engine.plan import BatchPlan, plan_case
from kit.engine.pools import CASE_LAYER_ID, POOL_CACHE, Pools
from kit.engine.reference import logical_kv, references
from kit.engine.transfer import to_device

# Batches kept built past the budget (_budget): one run's (at most 6) and more, so that a
# case's graph run finds the batch its eager run built (kit.plugin.selection orders them so).
SHARED_BATCHES = 8


@dataclasses.dataclass
class LayerInputs:
    """One layer's random inputs for a batch."""

    q: torch.Tensor  # [num_tokens, Hq, D] new tokens' queries
    k_new: torch.Tensor  # [num_tokens, Hkv, D] new tokens' keys, handed to forward()
    v_new: torch.Tensor  # [num_tokens, Hkv, Dv]; MLA: a view of k_new (the latent's first Dv columns)
    k_old: torch.Tensor  # [sum n_old, Hkv, D] cached tokens' keys, in request order
    v_old: torch.Tensor

    @property
    def v_in_k(self) -> bool:
        """V is a view of K's leading columns (MLA's latent), not a tensor of its own."""
        return self.v_new.untyped_storage().data_ptr() == self.k_new.untyped_storage().data_ptr()

    def owned(self) -> List[torch.Tensor]:
        """The tensors these inputs hold (V left out where it is a view of K)."""
        return [self.q, self.k_new, self.k_old] + ([] if self.v_in_k else [self.v_new, self.v_old])

    def _with_v(self, q: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor]):
        return q, k, (k[..., :self.v_new.shape[-1]] if self.v_in_k else v)

    def named(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> List[Tuple[str, torch.Tensor]]:
        """(name, tensor) of what holds each input (V left out where it is a view of K)."""
        return [("q", q), ("k", k)] + ([] if self.v_in_k else [("v", v)])

    def _storage(self, rows: int, form: str, new) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) of `rows` tokens in `form` (kit.engine.case.INPUT_FORMS), from `new(like, shape)`:
        tensors of their own, or views of one fused QKV row per token, as a model's QKV projection
        hands them (head stride D, token stride the row's width)."""
        if form == "contiguous":
            def own(like):
                return new(like, (rows,) + tuple(like.shape[1:]))
            return self._with_v(own(self.q), own(self.k_new), None if self.v_in_k else own(self.v_new))
        if form != "fused_qkv" or self.v_in_k:
            raise ValueError(f"no {form!r} form for these inputs")
        parts = (self.q, self.k_new, self.v_new)
        widths = [x.shape[1] * x.shape[2] for x in parts]
        row = new(self.q, (rows, sum(widths)))
        views, start = [], 0
        for x, width in zip(parts, widths):
            views.append(row[:, start:start + width].unflatten(1, tuple(x.shape[1:])))
            start += width
        return tuple(views)

    def handed(self, form: str = "contiguous") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copies of (q, k, v) for forward(), in `form`: the inputs are shared with other runs of
        the batch, and each run judges whether forward() left its copies as they were. V stays a
        view of K where it is one."""
        copies = self._storage(self.q.shape[0], form, lambda like, shape: like.new_empty(shape))
        for (_, copy), (_, x) in zip(self.named(*copies), self.named(self.q, self.k_new, self.v_new)):
            copy.copy_(x)
        return copies

    def buffers(self, rows: int, form: str = "contiguous") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Zeroed (q, k, v) of `rows` tokens shaped as these, in `form` (a graph's static inputs),
        V a view of K where it is one."""
        return self._storage(rows, form, lambda like, shape: like.new_zeros(shape))


@dataclasses.dataclass
class Fixture:
    plan: BatchPlan
    pools: Pools
    layers: Tuple[Layer, ...]  # the model, in layer order (layer_id = index)
    inputs: List[LayerInputs]  # per layer
    batch: ForwardBatch
    # Per layer id, the (float64 golden, same-dtype) references (Fixture.reference), shared by
    # every fixture of this batch in the process. init=False: a fixture made from
    # another with dataclasses.replace (a planted bug) starts without them.
    references: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False)
    # Per pool size, what install() copies in (Fixture._installed), shared the same way.
    tables: Dict[tuple, tuple] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def case(self):
        return self.plan.case

    # The case's own layer, the one most checks and tests look at.
    @property
    def q(self) -> torch.Tensor:
        return self.inputs[CASE_LAYER_ID].q

    @property
    def k_new(self) -> torch.Tensor:
        return self.inputs[CASE_LAYER_ID].k_new

    @property
    def v_new(self) -> torch.Tensor:
        return self.inputs[CASE_LAYER_ID].v_new

    def logical_kv(self, layer_id: int = CASE_LAYER_ID) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per request, K and V of every logical token of a layer in order (cached, then new)."""
        return logical_kv(self.plan, self.inputs[layer_id])

    def reference(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(float64 golden, same-dtype reference) of one layer: computed once per batch and
        process for every layer (self.references is shared by every run of the batch), never
        by a run (fixtures_for computes them before a backend is made)."""
        if layer_id not in self.references:
            self.references.update(references(self))
        return self.references[layer_id]

    def install(self) -> None:
        """Write this fixture into the (shared, reused) pools, in place: poison everywhere,
        then the cached tokens' K/V and the requests' req_to_token rows."""
        kv, r2t = self.pools.token_to_kv_pool, self.pools.req_to_token_pool.req_to_token
        kv.reset()
        old_slots, table = self._installed(kv, r2t)
        if old_slots is not None:
            for layer_id, x in enumerate(self.inputs):
                k_old, v_old = kv.stored(layer_id, x.k_old, x.v_old)
                kv.k_buffer[layer_id][old_slots] = k_old
                kv.v_buffer[layer_id][old_slots] = v_old
        r2t.copy_(table)

    def _installed(self, kv, r2t) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """(slots of the cached tokens, the req_to_token table) for pools of this size: built
        once per batch and pool size (shared like the references), copied in by install()."""
        key = (kv.size, tuple(r2t.shape))
        if key not in self.tables:
            plan, device = self.plan, kv.device
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
            self.tables[key] = (old_slots, table)
        return self.tables[key]


def make_batch(plan: BatchPlan, pools: Pools, device) -> ForwardBatch:
    """The common ForwardBatch fields, then the fields the case's mode fills."""
    reqs = plan.requests
    seq_lens = [r.seq_len for r in reqs]
    return ForwardBatch(
        forward_mode=plan.case.mode,
        batch_size=len(reqs),
        req_pool_indices=to_device([r.row for r in reqs], device, torch.int32),
        seq_lens=to_device(seq_lens, device, torch.int32),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        seq_lens_sum=sum(seq_lens),
        out_cache_loc=to_device([s for r in reqs for s in r.slots[r.n_old:]], device, torch.int64),
        positions=to_device([p for r in reqs for p in r.q_pos], device, torch.int64),
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.token_to_kv_pool,
        **rules_for(plan.case.mode).batch_fields(plan, device),
    )


@dataclasses.dataclass
class _Shared:
    """What a batch case determines, without pools: shared by the fixtures of every run of it."""

    plan: BatchPlan
    layers: Tuple[Layer, ...]
    inputs: List[LayerInputs]  # never handed to a backend (kit.harness.runner hands copies)
    references: Dict[int, Tuple[torch.Tensor, torch.Tensor]]
    tables: Dict[tuple, tuple]
    sealed: Optional[torch.Tensor] = None  # fingerprint of tensors(), once complete
    counted: int = 0  # bytes counted against the budget, while kept

    def tensors(self) -> List[torch.Tensor]:
        held = [t for x in self.inputs for t in x.owned()]
        held += [t for pair in self.references.values() for t in pair]
        return held + [t for pair in self.tables.values() for t in pair if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _budget(device: torch.device) -> int:
    """Bytes of batches kept for the whole process (kit.process.budget)."""
    return budget.kept(device)


def _inputs(plan: BatchPlan, layers: Tuple[Layer, ...], device) -> List[LayerInputs]:
    """Random inputs for the plan (never constant), per layer."""
    case = plan.case
    gen = torch.Generator(device=device).manual_seed(case.rng_seed(2))
    hq, hkv, d, dt = case.num_q_heads, case.num_kv_heads, case.head_dim, case.torch_dtype

    def randn(n, h):
        return torch.randn((n, h, d), generator=gen, device=device).to(dt)

    n_tok = plan.num_tokens
    n_old = sum(r.n_old for r in plan.requests)
    inputs = {}
    for layer in (layers[CASE_LAYER_ID],) + layers[:CASE_LAYER_ID]:  # the case's layer first: its data is stable
        if case.is_mla:  # one latent row per token (every column drawn on its own); V is its first columns
            q, k_new, k_old = randn(n_tok, hq), randn(n_tok, 1), randn(n_old, 1)
            v_new, v_old = k_new[..., :case.kv_lora_rank], k_old[..., :case.kv_lora_rank]
        else:
            q, k_new, v_new = randn(n_tok, hq), randn(n_tok, hkv), randn(n_tok, hkv)
            k_old, v_old = randn(n_old, hkv), randn(n_old, hkv)
        inputs[layer.layer_id] = LayerInputs(q=q, k_new=k_new, v_new=v_new, k_old=k_old, v_old=v_old)
    return [inputs[i] for i in range(len(layers))]


class _SharedBatches:
    """Batches built, by everything that determines them: the batch case (every field, the
    layer config included; its repr, as a catalog may give lists) and the device. The runs
    of a backend go case after case, then the next backend's (kit.plugin.selection): each
    batch is kept for the whole process while the budget (_budget) lasts, so that every
    backend is judged on it as built once; past the budget, the last SHARED_BATCHES are."""

    def __init__(self):
        self._kept: Dict[Tuple[str, str], _Shared] = {}
        self._kept_bytes = 0
        self._recent: "collections.OrderedDict[Tuple[str, str], _Shared]" = collections.OrderedDict()

    def get(self, case: Case, device: torch.device) -> _Shared:
        """The batch as kept, unchecked (fixtures_for checks it), else built."""
        key = (repr(case), str(device))
        shared = self._kept.get(key) or self._recent.get(key)
        if shared is not None:
            if key in self._recent:
                self._recent.move_to_end(key)
            return shared
        plan, layers = plan_case(case), model_layers(case)
        shared = _Shared(plan, layers, _inputs(plan, layers, device), {}, {})
        self._recent[key] = shared
        while len(self._recent) > SHARED_BATCHES:
            self._recent.popitem(last=False)
        return shared

    def clear(self) -> None:
        self._kept.clear()
        self._kept_bytes = 0
        self._recent.clear()

    def forget(self, case: Case, device: torch.device) -> None:
        """Changed behind the kit's back: built again by the next get()."""
        key = (repr(case), str(device))
        shared = self._kept.pop(key, None)
        if shared is not None:
            self._kept_bytes -= shared.counted
        self._recent.pop(key, None)

    def seal(self, case: Case, device: torch.device, shared: _Shared) -> None:
        """`shared` is complete (references, the table of this run's pool): fingerprinted, and
        kept for the process if the budget allows."""
        shared.sealed = fingerprint(shared.tensors())
        key = (repr(case), str(device))
        if key in self._kept:  # grown while kept (the table of a larger pool): counted again
            self._kept_bytes -= shared.counted
        elif key in self._recent and self._kept_bytes + shared.nbytes <= _budget(device):
            self._kept[key] = self._recent.pop(key)
        else:
            return
        shared.counted = shared.nbytes
        self._kept_bytes += shared.counted


SHARED = _SharedBatches()


def _pools_for(plans: Sequence[BatchPlan], first: Case, device: torch.device) -> Pools:
    """The (cached) pools big enough for every plan, the page size set to the case's. A new pool
    larger than what is free on the device now is made after the kit released what it keeps."""
    need = dict(num_slots=max(p.num_slots for p in plans), max_reqs=max(p.max_reqs for p in plans),
                max_context=max(p.max_context for p in plans), num_kv_heads=first.num_kv_heads,
                head_dim=first.head_dim, dtype=first.kv_torch_dtype, device=device, kv_lora_rank=first.kv_lora_rank)
    new = POOL_CACHE.new_bytes(**need)
    if new and new > budget.free_now(device):  # a driver query, only for a pool not cached
        from kit.process.memory import release  # a cycle: it releases this module's batches
        release()
    pools = POOL_CACHE.get(**need)
    pools.token_to_kv_pool.page_size = first.page
    return pools


def fixtures_for(cases: Sequence[Case], device) -> List[Fixture]:
    """Fixtures for `cases` (one run: the same page size and layer config), sharing one
    (cached) pool big enough for all of them: a graph's replays must all read the pool
    it was captured against. The pool's page size is set here, once per run; each
    fixture's batch object is its own; call install() before each use. Everything shared
    (references, the pool's req_to_token table) is complete before a backend is made."""
    device = torch.device(device)
    shared = [SHARED.get(c, device) for c in cases]
    pools = _pools_for([s.plan for s in shared], cases[0], device)
    kv = pools.token_to_kv_pool
    # What this run reuses (kept batches, the pool's poison) against its fingerprint, in one read back.
    reused = [i for i, s in enumerate(shared) if s.sealed is not None]  # unsealed: a run failed building it
    kept = unchanged([(shared[i].sealed, shared[i].tensors(), f"the batch {cases[i].name}") for i in reused]
                     + [kv.sealed_poison()])
    for i, ok in zip(reused, kept):
        if not ok:
            SHARED.forget(cases[i], device)
            shared[i] = SHARED.get(cases[i], device)
    if not kept[-1]:
        kv.draw_poison()
    fixtures = []
    for case, s in zip(cases, shared):
        fx = Fixture(plan=s.plan, pools=pools, layers=s.layers, inputs=s.inputs,
                     batch=make_batch(s.plan, pools, device))
        fx.references, fx.tables = s.references, s.tables
        held = len(s.tensors())
        fx.reference(CASE_LAYER_ID)
        fx._installed(pools.token_to_kv_pool, pools.req_to_token_pool.req_to_token)
        if s.sealed is None or len(s.tensors()) != held:
            SHARED.seal(case, device, s)
        fixtures.append(fx)
    return fixtures
