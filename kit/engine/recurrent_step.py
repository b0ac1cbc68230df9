"""One step of a recurrent case (kit.engine.kinds.recurrent): the model's layers, each request's state slot and saved state, the inputs
forward() is handed, the batch, and the float64 reference of every output and state.

A request's saved state is the reference's own, after `prefix` tokens drawn for it (not a random
state: the step continues a real sequence), as the pool stores it (float32 state, the window's rows
in the model's dtype). Slots are drawn among the pool's (never 0, which vLLM keeps as its null
block), so that a backend that reads slot i for request i reads poison.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import List, Optional, Sequence, Tuple

import torch

from kit.engine.case import DTYPES
from kit.engine.kinds.recurrent import RecurrentCase, RecurrentLayer
from kit.engine.numerics import ENVELOPE_STEPS
from kit.engine.recurrent_reference import RecurrentRun, run_request
from kit.engine.state_pool import PADDED_SLOT, StateGeometry, StateLayout
from kit.modes import ForwardMode

MIN_SLOTS = 16


@dataclasses.dataclass
class RecurrentBatch:
    """What a backend reads of a step (the fields SGLang's and vLLM's GDN and Mamba2 metadata derive from)."""

    forward_mode: ForwardMode
    batch_size: int
    num_tokens: int
    state_indices: torch.Tensor  # [bs] int32, a request's state slot (padded rows: the backend's pad slot)
    query_start_loc: torch.Tensor  # [bs + 1] int32
    has_initial_state: torch.Tensor  # [bs] bool: the slot holds the request's saved state (else start from zeros)
    extend_seq_lens_cpu: List[int]
    draft_token_num: int = 0  # TARGET_VERIFY: each request's drafts, whose states go to the intermediate pools
    seq_lens_cpu: Optional[List[int]] = None  # each request's tokens after the step (its prefix and new ones)
    # Under an engine whose requests own several state blocks (vLLM's speculative decoding,
    # kit.harness.recurrent_rules): each request's blocks [bs, blocks] int32, and the previous step's
    # kept tokens [bs] int32 it continues from; None elsewhere.
    state_blocks: Optional[torch.Tensor] = None
    num_accepted_tokens: Optional[torch.Tensor] = None


@dataclasses.dataclass
class LayerInputs:
    rows: torch.Tensor  # [T, conv_dim] the projection before the conv
    gates: Tuple[torch.Tensor, ...]  # the kind's GATES (GDN: a, b; Mamba2: dt; KDA: g [T, Hv K], b), [T, Hv] but KDA's g

    def handed(self) -> Tuple[torch.Tensor, ...]:
        """forward()'s leading arguments: the projection, then the gates."""
        return (self.rows,) + self.gates


@dataclasses.dataclass
class Start:
    """Where a request starts in one layer: its conv window and state, float64, and whether the
    pool holds them (False: a new request, zeros)."""

    window: torch.Tensor
    state: torch.Tensor
    saved: bool


@dataclasses.dataclass
class RecurrentFixture:
    case: RecurrentCase
    layers: Tuple[RecurrentLayer, ...]
    slots: List[int]
    inputs: List[LayerInputs]  # per layer
    starts: List[List[Start]]  # per layer, per request
    golden: List[List[RecurrentRun]]  # per layer, per request, float64 (states [Hv, K, V]), taking the exact casts
    same_dtype: List[List[RecurrentRun]]  # per layer, per request, float32 arithmetic (the tolerance's scale)
    geometry: StateGeometry
    layout: StateLayout
    blocks: List[List[int]]  # per request, the state slots it owns (the first: `slots`)
    casts: Tuple[Tuple[str, ...], ...] = ()  # per request: the declared recurrent casts the references take
    # per layer, per request: the golden taking the envelope's casts too (None: none declared)
    envelope: Optional[List[List[RecurrentRun]]] = None

    @property
    def accepted_before(self) -> Optional[Tuple[int, ...]]:
        return self.layout.accepted_before

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, DTYPES[self.case.dtype])

    def install(self, pool) -> None:
        """Each request's saved window and state, every layer (new requests' slots keep poison): the
        window in its first slot at column a - 1, the state in its slot a - 1, a the previous step's
        kept tokens (the layout's accepted_before; 1 where it has none)."""
        width = self.case.conv_width - 1
        for layer_id, starts in enumerate(self.starts):
            for i, (blocks, start) in enumerate(zip(self.blocks, starts)):
                if start.saved:
                    offset = self.accepted_before[i] - 1 if self.accepted_before else 0
                    conv = pool.conv(layer_id)
                    conv[blocks[0], :, offset:offset + width] = start.window.to(conv.dtype)
                    pool.temporal(layer_id)[blocks[offset]] = as_pooled(start.state).to(torch.float32)

    def batch(self, device, padded_bs: Optional[int] = None, padded_slot: int = PADDED_SLOT,
              empty_padding: bool = False) -> Tuple[RecurrentBatch, List[LayerInputs]]:
        """The step's batch and each layer's inputs; with padded_bs, padded to that many rows as a
        graph runner pads (a padded row: slot `padded_slot`, no saved state, the real rows' token
        count a request, zero inputs; with `empty_padding`, as vLLM's runner pads, an empty request
        and the same tokens after the real ones, nobody's)."""
        lens = list(self.case.new_lens)
        slots, saved = list(self.slots), [s.saved for s in self.starts[0]]
        pad = (padded_bs or self.case.bs) - self.case.bs
        extra = pad * lens[-1]
        lens += [0 if empty_padding else lens[-1]] * pad
        slots += [padded_slot] * pad
        saved += [False] * pad
        inputs = [LayerInputs(*_split_back([torch.cat([t, t.new_zeros((extra,) + t.shape[1:])]) for t in x.handed()]))
                  for x in self.inputs]
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        mode = self.case.mode
        batch = RecurrentBatch(
            forward_mode=mode, batch_size=len(lens), num_tokens=sum(lens) + (extra if empty_padding else 0),
            state_indices=torch.tensor(slots, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            has_initial_state=torch.tensor(saved, dtype=torch.bool, device=device),
            extend_seq_lens_cpu=lens,
            draft_token_num=self.case.new if mode == ForwardMode.TARGET_VERIFY else 0,
            seq_lens_cpu=[p + n for p, n in zip(list(self.case.prefix) + [0] * pad, lens)])
        if self.layout.blocks > 1 or self.accepted_before:
            rows = self.blocks + [[padded_slot] * self.layout.blocks] * pad
            batch.state_blocks = torch.tensor(rows, dtype=torch.int32, device=device)
            batch.num_accepted_tokens = torch.tensor(list(self.accepted_before or [1] * self.case.bs) + [1] * pad,
                                                     dtype=torch.int32, device=device)
        return batch, inputs


def as_pooled(state: torch.Tensor) -> torch.Tensor:
    """A state of the kit's [Hv, K, V] arithmetic as the pool lays it out, [Hv, V, K] (kit.engine.state_pool)."""
    return state.transpose(-1, -2)


def _split_back(tensors: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
    return tensors[0], tuple(tensors[1:])


def _layer(case: RecurrentCase, layer_id: int, dtype: torch.dtype, device) -> RecurrentLayer:
    gen = torch.Generator().manual_seed(case.rng_seed(f"layer{layer_id}") & 0x7FFFFFFF)
    hk, hv = case.heads
    conv = (torch.randn(case.conv_dim, case.conv_width, generator=gen) / math.sqrt(case.conv_width)).to(dtype)
    a_log = torch.empty(hv).uniform_(1, 16, generator=gen).log()
    # KDA's, one per key channel of each head, drawn apart: a bias read once per head shows.
    dt = torch.empty(case.spec.dt_bias_width(case)).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) = dt: Mamba's initialization
    skip = torch.empty(hv).uniform_(0.5, 1.5, generator=gen).to(device) if case.kind == "mamba2" else None
    return RecurrentLayer(kind=case.kind, layer_id=layer_id, num_k_heads=hk, num_v_heads=hv, head_k_dim=case.head_k_dim,
                          head_v_dim=case.head_v_dim, conv_weights=conv.to(device), A_log=a_log.to(device),
                          dt_bias=dt_bias.to(device), D=skip)


def _draw(case: RecurrentCase, n: int, salt: str, dtype: torch.dtype, device) -> LayerInputs:
    gen = torch.Generator().manual_seed(case.rng_seed(salt) & 0x7FFFFFFF)
    drawn = [torch.randn(shape, generator=gen).to(dtype).to(device)
             for shape in [(n, case.conv_dim)] + [(n, w) for w in case.spec.gate_widths(case)]]
    return LayerInputs(*_split_back(drawn))


def _saved(case: RecurrentCase, layer: RecurrentLayer, request: int, dtype: torch.dtype, device) -> Start:
    """The state after the request's `prefix` drawn tokens, as the pool stores it, read back in float64."""
    zero_window = torch.zeros(case.conv_dim, case.conv_width - 1, dtype=torch.float64, device=device)
    zero_state = torch.zeros(case.heads[1], case.head_k_dim, case.head_v_dim, dtype=torch.float64, device=device)
    n = case.prefix[request]
    if not n:
        return Start(zero_window, zero_state, saved=False)
    x = _draw(case, n, f"prefix{request}/layer{layer.layer_id}", dtype, device)
    run = run_request(layer, x.rows, x.gates, zero_window, zero_state)
    return Start(run.windows[-1].to(dtype).double(), run.states[-1].float().double(), saved=True)


def _split(x: LayerInputs, lens: Sequence[int]) -> List[LayerInputs]:
    """Per request, its rows of `x`."""
    return [LayerInputs(*_split_back(parts)) for parts in zip(*(t.split(list(lens)) for t in x.handed()))]


def build(case: RecurrentCase, device, starts: Optional[List[List[Start]]] = None,
          blocks: Optional[List[List[int]]] = None, layers: Optional[Tuple[RecurrentLayer, ...]] = None,
          layout: Optional[StateLayout] = None, casts: Sequence[Sequence[str]] = ()) -> RecurrentFixture:
    """The case's step, its states kept as `layout` says (by default SGLang's: a slot a request, a
    verify's drafts in the intermediate pools). The step after a verify continues the verify's: its
    model (`layers`), its requests' state `blocks`, and (per layer, per request) `starts`, the
    reference's kept drafts, instead of the saved states its prefixes give. `casts`: per request, the
    backend's declared recurrent casts its rows take (none where empty); the references take the exact
    ones, the envelope all."""
    dtype = getattr(torch, DTYPES[case.dtype])
    layers = layers or tuple(_layer(case, i, dtype, device) for i in case.linear_layers)
    layout = layout or StateLayout(intermediate_drafts=case.new if case.mode == ForwardMode.TARGET_VERIFY else 0)
    owned = case.bs * layout.blocks
    geometry = StateGeometry(slots=max(MIN_SLOTS, 1 << (2 * owned + 1).bit_length()), conv_dim=case.conv_dim,
                             conv_width=case.conv_width, num_v_heads=case.heads[1], head_k_dim=case.head_k_dim,
                             head_v_dim=case.head_v_dim, drafts=layout.intermediate_drafts,
                             spec_columns=layout.spec_columns, layers=len(layers))
    if blocks is None:
        drawn = random.Random(case.rng_seed("slots")).sample(range(1, geometry.slots), owned)
        blocks = [drawn[i * layout.blocks:(i + 1) * layout.blocks] for i in range(case.bs)]
    slots = [row[0] for row in blocks]
    if starts is None:
        starts = [[_saved(case, layer, i, dtype, device) for i in range(case.bs)] for layer in layers]
    inputs = [_draw(case, sum(case.new_lens), f"step/layer{layer.layer_id}", dtype, device) for layer in layers]
    casts = tuple(tuple(c) for c in casts) or ((),) * case.bs
    exact = tuple(tuple(c for c in request if c not in ENVELOPE_STEPS) for request in casts)

    def runs(dtype: torch.dtype, taken: Tuple[Tuple[str, ...], ...]) -> List[List[RecurrentRun]]:
        return [[run_request(layer, p.rows, p.gates, s.window, s.state, dtype, t, position)
                 for p, s, t, position in zip(_split(x, case.new_lens), layer_starts, taken, case.prefix)]
                for layer, x, layer_starts in zip(layers, inputs, starts)]
    envelope = runs(torch.float64, casts) if casts != exact else None
    return RecurrentFixture(case, layers, slots, inputs, starts, runs(torch.float64, exact), runs(torch.float32, exact),
                            geometry, layout, blocks, casts, envelope)


def kept_draft(fx: RecurrentFixture, accepted: Sequence[int]) -> List[List[Start]]:
    """Per layer, per request: where a request that keeps `accepted[i]` drafts of a verify continues
    (the reference's state and window after that draft)."""
    return [[Start(run.windows[n - 1].double(), run.states[n - 1], saved=True) for run, n in zip(runs, accepted)]
            for runs in fx.golden]
