"""The checks a run is judged by, each a `Check` with ok / describe() and its failure
class: output against the float64 golden, the output's form, the KV pool after the call,
the inputs forward() was handed, padded rows and captured tensors of a replay
(kit/harness/guard.py adds writes past a backend allocation). kit/harness/verdict.py names them in a verdict.

Output rules, both per token row:
- error ratio (as PyTorch's flex-attention tests): the backend's max error
  against the float64 golden may not exceed RATIO x the error of a same-dtype
  reference computation, plus an absolute floor per dtype;
- magnitude: in every head, the RMS of the error over head_dim may not exceed
  REL_RMS[dtype] x the RMS of the golden output. Outputs of long contexts are
  small (about 1/sqrt(keys)), so the absolute floor alone lets a key go missing
  there: one key out of 1,100 moves a bf16 output by ~2e-3 < 1.6e-2. A golden
  RMS below the dtype's smallest normal number counts as that number: such an
  output has no relative precision to judge (fp16 flushes a sink-dominated
  head's ~1e-9 to zero).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

import torch

from kit.report.record import GRAPH, KERNEL, KV_WRITE


@dataclasses.dataclass
class Check:
    """What a failing check means, declared once per kind: `failure_class` when it is the
    run's own verdict, `graph_class` when a replay fails it but the same batch run eagerly is
    right. A `quiet` check is named in messages only when it fails; a `replay_only` check has
    no eager counterpart to diagnose a failure with; a check not `alone` judges a batch against
    the run's others, so the batch run again alone (on a fresh instance, eagerly) tells nothing.
    Subclasses are dataclasses."""

    failure_class: ClassVar[str] = KERNEL
    graph_class: ClassVar[str] = GRAPH
    quiet: ClassVar[bool] = False
    replay_only: ClassVar[bool] = False
    alone: ClassVar[bool] = True
    ok: bool

    def describe(self) -> str:
        raise NotImplementedError


@dataclasses.dataclass
class Pending:
    """A check whose figures are still on the device: the judge reads every check of a step
    back at once (`read_back`). Each read back waits for the GPU, and with several processes
    on one GPU each wait is a switch between their contexts (kit.engine.transfer)."""

    figures: Union[torch.Tensor, Tuple[torch.Tensor, ...]]  # 1-D; a tuple where they lie on several devices
    finish: Callable[[List[float]], object]  # the figures' values, in order -> the check (or checks)

    def parts(self) -> Tuple[torch.Tensor, ...]:
        return self.figures if isinstance(self.figures, tuple) else (self.figures,)


def read_back(pending: Sequence[Pending]) -> list:
    """What each of `pending` finishes to, in order, from one read back per device."""
    parts = [(i, t) for i, p in enumerate(pending) for t in p.parts()]
    by_device: Dict[torch.device, List[int]] = {}
    for k, (_, t) in enumerate(parts):
        by_device.setdefault(t.device, []).append(k)
    got: Dict[int, List[float]] = {}
    for keys in by_device.values():
        flat = torch.cat([parts[k][1].to(torch.float64) for k in keys]).tolist()
        for k in keys:
            got[k], flat = flat[:parts[k][1].numel()], flat[parts[k][1].numel():]
    values: List[List[float]] = [[] for _ in pending]
    for k, (i, _) in enumerate(parts):
        values[i] += got[k]
    return [p.finish(v) for p, v in zip(pending, values)]


RATIO = 2.0
ABS_FLOOR = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# A correct kernel rounds P and the output to the dtype: per head, an RMS error of about one
# unit of roundoff u of the output's RMS. bf16 (u = 2^-8): 3 u is 3x the worst honest
# computation measured on the full set (split-KV, partial outputs rounded as FlashInfer
# does: 3.7e-3), and a missing key moves a head by about p_key / sqrt(sum p^2) (a
# one-key-short decode of 1,101 keys, 8 heads: >= 1.56e-2 in 12 draws; 1 draw in 1,000
# below 1.13e-2). fp16 gets the same bound, not 3 of its own finer u: a soft cap computed
# with an approximate tanh (FlashInfer: tanh.approx.f32, relative error up to 2^-11)
# moves fp16 outputs by up to 2.3e-3, more than fp16's rounding (4.8e-4). Scores must be
# accumulated in fp32, as tensor-core kernels do: scores rounded to bf16 (a plain bf16
# matmul, the same-dtype reference) cost up to 2e-2, as much as a missing key. fp32:
# the floor's 1e-4.
REL_RMS = {torch.float32: 1e-4, torch.float16: 3 * 2.0 ** -8, torch.bfloat16: 3 * 2.0 ** -8}


@dataclasses.dataclass
class OutputCheck(Check):
    max_err: float
    ref_err: float
    tol: float
    bad_rows: List[int]  # token rows past tolerance (first few)
    nonfinite_rows: int
    max_rel: float = 0.0  # worst head's RMS error / the golden's RMS
    rel_tol: float = 0.0
    compared: bool = True  # False: shapes differ (FormCheck says how)
    label: str = ""  # which output, e.g. "layer 0 "

    @property
    def excess(self) -> float:
        """How far past tolerance the worst row is (> 1: failing), by either rule."""
        return max(self.max_err / self.tol, self.max_rel / self.rel_tol) if self.compared else float("inf")

    def describe(self) -> str:
        what = f"{self.label}output"
        if not self.compared:
            return f"{what} not compared (its form is wrong)"
        if self.ok:
            return f"{what} ok: max err {self.max_err:.3g} <= tol {self.tol:.3g}"
        parts = [f"{what} wrong: max err {self.max_err:.3g} {'>' if self.max_err > self.tol else '<='} "
                 f"tol {self.tol:.3g}"]
        if self.max_rel > self.rel_tol:
            parts.append(f"a head's error is {self.max_rel:.3g} of its output's magnitude (RMS) > {self.rel_tol:.3g}")
        if self.nonfinite_rows:
            parts.append(f"{self.nonfinite_rows} rows NaN/inf (unwritten?)")
        parts.append(f"bad token rows {self.bad_rows}")
        return "; ".join(parts)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(dim=-1).sqrt()


def _known(check) -> Pending:
    """A check decided without the device."""
    return Pending(torch.zeros(0), lambda values: check)


def check_output(out: torch.Tensor, golden: torch.Tensor, same_dtype_ref: torch.Tensor,
                 dtype: torch.dtype, label: str = "") -> OutputCheck:
    return read_back([output_figures([out], [golden], [same_dtype_ref], dtype, [label])])[0][0]


def output_figures(outs: Sequence[torch.Tensor], goldens: Sequence[torch.Tensor], same_dtype_refs: Sequence[torch.Tensor],
                   dtype: torch.dtype, labels: Sequence[str],
                   declared: Optional[Sequence[Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]]] = None) -> Pending:
    """Each layer's output against its golden (finishes to one OutputCheck per layer). The
    layers compared are stacked and judged by one set of operations, not one per layer: the
    maxima are those of each layer alone; a head's RMS may differ from one computed on a
    layer alone in float64's last bit (on the GPU the order of a sum follows the shape).
    `declared`: per layer, None or the (emulated, envelope) references of the backend's declared
    numerics (kit.engine.reference.declared): the output is judged against the emulated one, its
    tolerances widened by RATIO x the envelope's distance from it (largest, and a head's RMS
    relative to its output's); the same-dtype reference's error is the exact golden's either way."""
    declared = declared or [None] * len(outs)
    against = [d[0] if d is not None else g for d, g in zip(declared, goldens)]
    checks: List[object] = [None] * len(outs)
    for i, (out, golden, label) in enumerate(zip(outs, against, labels)):
        if tuple(out.shape) != tuple(golden.shape) or out.is_meta:  # no values to compare (the form check says why)
            checks[i] = OutputCheck(False, float("inf"), 0.0, 0.0, [], 0, compared=False, label=label)
        elif not golden.numel():
            checks[i] = OutputCheck(True, 0.0, 0.0, ABS_FLOOR[dtype], [], 0, 0.0, REL_RMS[dtype], label=label)
    judged = [i for i, c in enumerate(checks) if c is None]
    if not judged:
        return _known(checks)
    golden = torch.stack([against[i] for i in judged])  # [layers, T, Hq, D]
    exact = torch.stack([goldens[i] for i in judged])
    envelope = torch.stack([declared[i][1] if declared[i] is not None and declared[i][1] is not None else against[i]
                            for i in judged]) - golden
    out = torch.stack([outs[i].to(golden.device) for i in judged])
    err = out.to(torch.float64) - golden
    ref_err = (torch.stack([same_dtype_refs[i] for i in judged]).to(torch.float64) - exact).abs().flatten(1).amax(dim=1)
    golden_rms = _rms(golden).clamp_min(torch.finfo(dtype).tiny)
    tol = RATIO * (ref_err + envelope.abs().flatten(1).amax(dim=1)) + ABS_FLOOR[dtype]
    rel_tol = RATIO * (_rms(envelope) / golden_rms).nan_to_num(nan=0.0).flatten(1).amax(dim=1) + REL_RMS[dtype]
    row_err = err.abs().flatten(2).amax(dim=2).nan_to_num(nan=float("inf"))  # [layers, T]
    err_rms = _rms(err)  # [layers, T, Hq]
    head_rel = (err_rms / golden_rms).nan_to_num(nan=float("inf"))
    row_rel = head_rel.amax(dim=2)
    bad = (row_err > tol[:, None]) | (row_rel > rel_tol[:, None])
    nonfinite = (~torch.isfinite(out.flatten(2))).any(dim=2).sum(dim=1).to(torch.float64)
    figures = torch.stack([ref_err, tol, row_err.amax(dim=1), row_rel.amax(dim=1), rel_tol, bad.sum(dim=1).double(),
                           nonfinite], dim=1)

    def finish(values: List[float]) -> List[OutputCheck]:
        for j, i in enumerate(judged):
            ref_err, tol, max_err, max_rel, rel_tol, num_bad, nonfinite = values[7 * j:7 * j + 7]
            bad_rows = bad[j].nonzero().squeeze(1)[:8].tolist() if num_bad else []
            checks[i] = OutputCheck(not num_bad, max_err, ref_err, tol, bad_rows, int(nonfinite), max_rel,
                                    rel_tol, label=labels[i])
        return checks
    return Pending(figures.flatten(), finish)


# A log-sum-exp is judged per query row and head, within LSE_ABS + LSE_REL x its size (plus RATIO x the
# distance declared numerics' envelope puts between their emulations, as outputs are). Kernels sum the
# exponentials in fp32 (an error near 1e-6 of log(keys)); a soft cap through an approximate tanh
# (FlashInfer's tanh.approx.f32: relative 2^-11) moves each capped logit, and the LSE, by up to 2^-11 of
# the cap, within LSE_REL of an LSE that large. The bugs it is for are far past: log2 for a natural log
# (0.44 of the LSE), the scale left out, the cap or the sinks dropped, a split merged with a stale max.
LSE_ABS = 2.0 ** -10
LSE_REL = 2.0 ** -9


@dataclasses.dataclass
class LseCheck(Check):
    """The log-sum-exp forward() returned (a backend that declares returns_lse) against the reference's."""

    max_err: float  # at the row and head furthest past its tolerance
    tol: float  # that row and head's tolerance
    excess: float  # the worst error over its tolerance (> 1: failing)
    bad_rows: List[int]  # token rows past tolerance (first few)
    nonfinite_rows: int
    form: str = ""  # why it was not compared (its shape, dtype or device), or ""
    label: str = ""

    def describe(self) -> str:
        what = f"{self.label}lse"
        if self.form:
            return f"{what} not compared: {self.form}"
        if self.ok:
            return f"{what} ok: max err {self.max_err:.3g} <= tol {self.tol:.3g}"
        parts = [f"{what} wrong: max err {self.max_err:.3g} > tol {self.tol:.3g}"]
        if self.nonfinite_rows:
            parts.append(f"{self.nonfinite_rows} rows NaN/inf")
        return "; ".join(parts + [f"rows {self.bad_rows}"])


def lse_figures(lses: Sequence[torch.Tensor], references: Sequence[Tuple[torch.Tensor, Optional[torch.Tensor]]],
                labels: Sequence[str]) -> Pending:
    """Each layer's returned log-sum-exp [T, Hq] against its reference's (kit.engine.fixture.Step.lse: the
    float64 one, and its envelope's or None); finishes to one LseCheck per layer."""
    figures, finishers = [], []
    for lse, (ref, envelope), label in zip(lses, references, labels):
        if tuple(lse.shape) != tuple(ref.shape) or not lse.is_floating_point() or lse.device != ref.device:
            form = (f"shape {tuple(lse.shape)}, dtype {lse.dtype}, device {lse.device}, expected a float "
                    f"[{', '.join(map(str, ref.shape))}] (a query row per token, a head each) on {ref.device}")
            finishers.append((0, lambda values, form=form, label=label: LseCheck(False, float("inf"), 0.0,
                                                                                  float("inf"), [], 0, form, label)))
            continue
        if not lse.numel():
            finishers.append((0, lambda values, label=label: LseCheck(True, 0.0, LSE_ABS, 0.0, [], 0, label=label)))
            continue
        spread = 0.0 if envelope is None else (envelope - ref).abs().max()
        tol = LSE_ABS + LSE_REL * ref.abs() + RATIO * spread
        err = (lse.to(torch.float64) - ref).abs().nan_to_num(nan=float("inf"))
        excess = err / tol
        worst = excess.flatten().argmax()
        bad = (excess > 1).any(dim=1)
        nonfinite = (~torch.isfinite(lse)).any(dim=1).sum()
        figures.append(torch.stack([excess.flatten()[worst], err.flatten()[worst], tol.flatten()[worst],
                                    bad.sum().double(), nonfinite.double()]))

        def finish(values, bad=bad, label=label):
            excess, err, tol, num_bad, nonfinite = values
            rows = bad.nonzero().squeeze(1)[:8].tolist() if num_bad else []
            return LseCheck(not num_bad, err, tol, excess, rows, int(nonfinite), label=label)
        finishers.append((5, finish))

    def finish_all(values: List[float]) -> List[LseCheck]:
        checks, at = [], 0
        for width, finish in finishers:
            checks.append(finish(values[at:at + width]))
            at += width
        return checks
    stacked = torch.cat(figures) if figures else torch.zeros(0, dtype=torch.float64)
    return Pending(stacked, finish_all)


@dataclasses.dataclass
class FormCheck(Check):
    """The output is the tensor the layer takes: [T, Hq, Dv], q's dtype, on q's device. A
    float64 or fp16 output for a bf16 case can hold right values and still break o_proj."""

    quiet = True
    problems: List[str]
    label: str = ""

    def describe(self) -> str:
        what = f"{self.label}output form"
        return f"{what} ok" if self.ok else f"{what} wrong: " + "; ".join(self.problems)


def check_form(out: torch.Tensor, q: torch.Tensor, label: str = "", v_head_dim: Optional[int] = None) -> FormCheck:
    """Against the q handed to forward() ([T, Hq, D], the case's dtype and device); each head's
    output is v_head_dim wide (default: q's D; MLA: the latent's rank)."""
    shape = tuple(q.shape) if v_head_dim is None else tuple(q.shape[:-1]) + (v_head_dim,)
    expected = {"shape": shape, "dtype": q.dtype, "device": q.device}
    found = {"shape": tuple(out.shape), "dtype": out.dtype, "device": out.device}
    return FormCheck(found == expected, [f"{k} {found[k]}, expected {expected[k]}" for k in expected
                                         if found[k] != expected[k]], label)


# A softmax average cannot leave the range of the values it averages; rounding P and the
# output may overshoot by a few units of roundoff.
PADDED_RANGE_SLACK = 1 + 2.0 ** -6


@dataclasses.dataclass
class PaddingCheck(Check):
    failure_class = GRAPH
    quiet = True
    replay_only = True  # eager runs have no padded rows
    num_rows: int
    nonfinite_rows: List[int]  # padded rows (counted from the first padded one) holding NaN/inf, first few
    out_of_range_rows: List[int]  # finite padded rows past the pool's values, first few
    bound: float  # the largest |V| in the pool

    def describe(self) -> str:
        if self.ok:
            return f"{self.num_rows} padded rows finite and within the pool's values"
        parts = []
        if self.nonfinite_rows:
            parts.append(f"padded rows not finite: {len(self.nonfinite_rows)} of {self.num_rows} hold NaN/inf, e.g. "
                         f"{self.nonfinite_rows[:8]} (unwritten or divided by zero?)")
        if self.out_of_range_rows:
            parts.append(f"padded rows out of range: {len(self.out_of_range_rows)} of {self.num_rows} exceed the "
                         f"largest |V| in the pool ({self.bound:.3g}), e.g. {self.out_of_range_rows[:8]} "
                         f"(unnormalized, or read outside the pool?)")
        return "; ".join(parts)


def check_padding(padded: Sequence[torch.Tensor], pool) -> PaddingCheck:
    return read_back([padding_figures(padded, pool)])[0]


def padding_figures(padded: Sequence[torch.Tensor], pool) -> Pending:
    """Padded rows (of each layer's output, counted across them) are compared to nothing:
    engines drop their results, and what they attend (the fill value, a clamped length) is
    the backend's choice. But the rest of the model runs on them, so they must be finite (a
    NaN reaches MoE routing and collectives) and, as any softmax over any slots of the pool
    is, within the range of the pool's values: a huge finite row overflows in the next norm,
    or sets the scale of a dynamic per-tensor activation quantization and with it the real
    rows' precision."""
    bound = pool.value_bound().float()
    rows = torch.cat([out.flatten(1).to(torch.float32) for out in padded]) if padded else torch.zeros(0, 1)
    rows = rows.to(bound.device)
    nonfinite = ~torch.isfinite(rows).all(dim=1)
    out_of_range = ~nonfinite & (rows.abs() > bound * PADDED_RANGE_SLACK).any(dim=1)

    def finish(values: List[float]) -> PaddingCheck:
        bound_value, num_bad = values
        if not num_bad:
            return PaddingCheck(True, rows.shape[0], [], [], bound_value)
        return PaddingCheck(False, rows.shape[0], nonfinite.nonzero().squeeze(1).tolist(),
                            out_of_range.nonzero().squeeze(1).tolist(), bound_value)
    return Pending(torch.stack([bound, (nonfinite | out_of_range).sum().float()]), finish)


@dataclasses.dataclass
class StateCheck(Check):
    failure_class = GRAPH
    quiet = True
    replay_only = True  # eager runs capture nothing
    replaced: List[str]  # backend attributes holding another tensor than when the graph was captured

    def describe(self) -> str:
        if self.ok:
            return "captured tensors kept"
        return (f"the replay hooks replaced tensors the captured graph reads instead of refilling them in "
                f"place: {', '.join(self.replaced[:4])} (a real graph keeps reading the old ones)")


def check_state(replaced: List[str]) -> StateCheck:
    return StateCheck(not replaced, list(replaced))


@dataclasses.dataclass
class KVCheck(Check):
    failure_class = KV_WRITE
    graph_class = KV_WRITE
    missing: List[Tuple[int, int]]  # (layer, slot) that should hold the new K/V but do not (first few)
    collateral: List[int]  # slots changed that no real row owns (first few)
    num_missing: int
    num_collateral: int

    def describe(self) -> str:
        if self.ok:
            return "kv pool ok"
        parts = []
        if self.num_missing:
            parts.append(f"{self.num_missing} new-token slots not written correctly, e.g. {self.missing} (layer, slot)")
        if self.num_collateral:
            parts.append(f"{self.num_collateral} stray writes, e.g. slots {self.collateral} (layer, slot)")
        return "kv pool wrong: " + "; ".join(parts)


def bits(x: torch.Tensor) -> torch.Tensor:
    """x's bits as integers of its width (any strides: a view, no copy)."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-slot bitwise difference (NaN-safe) of [..., slots, heads, head_dim] tensors (fp8: their bytes)."""
    return (bits(a.flatten(-2)) != bits(b.flatten(-2))).any(dim=-1)


def check_kv(pool, state: "KVState") -> KVCheck:
    return read_back([kv_figures(pool, state)])[0]


@dataclasses.dataclass
class KVState:
    """What the KV pool must hold after a program: its poison everywhere but at `old_slots` (the
    cached tokens install() wrote: `old_kv` per layer, as stored) and at `loc` (the new tokens'
    slots: `writes`, layer_id -> (k, v) as forward() was handed them, of consecutive layers);
    slot 0 may hold anything where it is the engine's scratch slot (`scratch`)."""

    old_slots: Optional[torch.Tensor]
    old_kv: List[Tuple[torch.Tensor, torch.Tensor]]
    loc: torch.Tensor
    writes: Dict[int, Tuple[torch.Tensor, torch.Tensor]]
    scratch: bool = True


def _slots(pool, blocks: torch.Tensor, against: torch.Tensor) -> torch.Tensor:
    """Per slot, whether one layer's [blocks, block, H, W] view differs from `against` bitwise."""
    return _differs(blocks, against).reshape(-1)


def kv_figures(pool, state: KVState) -> Pending:
    """The new k/v must sit at `state.loc` as the pool stores them (a quantized pool: quantized with
    the layer's scales, compared byte for byte); the cached tokens must be as installed; every
    other slot must still hold its poison, but the scratch slot. Compared against the known state,
    not a copy of the pool: a run costs what its own pool's size costs."""
    loc = state.loc.to(torch.int64)
    writes = state.writes
    first, last = (min(writes), max(writes)) if writes else (0, -1)
    if sorted(writes) != list(range(first, last + 1)):
        raise ValueError(f"writes must be of consecutive layers, got layers {sorted(writes)}")
    layers = range(len(pool.k_blocks))
    changed = torch.stack([_slots(pool, pool.k_blocks[lid], pool.poison_k[lid]) | _slots(pool, pool.v_blocks[lid],
                                                                                         pool.poison_v[lid])
                           for lid in layers])  # [layers, slots]
    if state.old_slots is not None:
        at_old = pool.at(state.old_slots)
        kept_old = torch.stack([_differs(pool.k_blocks[lid][at_old], k) | _differs(pool.v_blocks[lid][at_old], v)
                                for lid, (k, v) in zip(layers, state.old_kv)])
        changed[:, state.old_slots] = kept_old  # an installed token is a stray write only where it changed
    if state.scratch:
        changed[:, :1].fill_(False)  # a fill, not `changed[:, 0] = False`: that copies False from the host and waits
    if writes:
        at_new = pool.at(loc)
        lost = []
        for lid in range(first, last + 1):
            k, v = pool.stored(lid, *writes[lid])  # fp8: quantized, bit-exact
            lost.append(_differs(pool.k_blocks[lid][at_new], k) | _differs(pool.v_blocks[lid][at_new], v))
        lost = torch.stack(lost) & (loc != 0)
        changed[first:last + 1].index_fill_(1, loc, False)
    else:
        lost = torch.zeros((0, loc.numel()), dtype=torch.bool, device=changed.device)

    def finish(counts: List[float]) -> KVCheck:
        num_missing, num_collateral = int(sum(counts[:lost.shape[0]])), int(sum(counts[lost.shape[0]:]))
        missing, collateral = [], []
        if num_missing or num_collateral:
            for lid, extra in enumerate(changed):
                if first <= lid <= last:
                    missing += [(lid, s) for s in loc[lost[lid - first]].unique()[:8].tolist()]
                collateral += [(lid, s) for s in extra.nonzero().squeeze(1)[:8].tolist()]
        return KVCheck(num_missing == 0 and num_collateral == 0, missing[:8], collateral[:8], num_missing,
                       num_collateral)
    return Pending(torch.cat([lost.sum(dim=1), changed.sum(dim=1)]), finish)


@dataclasses.dataclass
class Handed:
    """One input forward() was handed, after the call, and what it held when handed: the
    kit's own copy (None: zeros, a graph's padded rows and capture buffers)."""

    name: str  # "q", "k" or "v"
    where: str  # e.g. "layer 1", "layer 0, padded rows", "layer 1, at the capture of bucket 4"
    after: torch.Tensor
    before: Optional[torch.Tensor] = None
    first_row: int = 0  # the token row `after` starts at, in what forward() was handed


@dataclasses.dataclass
class InputsCheck(Check):
    """forward() left q, k and v as it was handed them, bit for bit: the model reuses them (a
    fused QKV row is the residual's neighbour; K/V feed other layers' caches, speculative drafts),
    so a backend that scales or casts them in place corrupts what comes after it."""

    quiet = True
    changed: List[str]  # one line per input changed
    SHOWN: ClassVar[int] = 3

    def describe(self) -> str:
        if self.ok:
            return "inputs kept"
        more = len(self.changed) - self.SHOWN
        return "; ".join(self.changed[:self.SHOWN]) + (f"; and {more} more inputs changed" if more > 0 else "")


def inputs_figures(handed: Sequence[Handed]) -> Pending:
    """How many values of each handed input differ from what it held (NaN-safe, -0.0 is not
    0.0), per token row; finishes to the lines of those changed. The comparison runs now: a
    graph's static inputs are refilled before the next replay."""
    diffs = [bits(h.after) != (bits(h.before) if h.before is not None else 0) for h in handed]
    counts = torch.stack([d.sum() for d in diffs]) if diffs else torch.zeros(0)

    def finish(values: List[float]) -> List[str]:
        changed = []
        for h, diff, count in zip(handed, diffs, values):
            if count:  # where, from the kept differences: the inputs may have been refilled since
                first = h.first_row + int(diff.flatten(1).any(dim=1).nonzero()[0, 0])
                changed.append(f"{h.name} passed to forward was changed in place: {int(count)} of "
                               f"{h.after.numel()} values differ, first in token row {first} ({h.where})")
        return changed
    return Pending(counts, finish)


def handed_inputs(fx, given, where: str = "") -> List[Handed]:
    """Each layer's (q, k, v) as handed (`given`, per layer of fx's model), against the kit's own
    inputs they were copied from (kit.engine.fixture.LayerInputs); `given` may hold only the
    first rows of each (a graph's real rows)."""
    handed = []
    for layer, x, qkv in zip(fx.layers, fx.inputs, given):
        for (name, after), (_, before) in zip(x.named(*qkv), x.named(x.q, x.k_new, x.v_new)):
            handed.append(Handed(name, f"layer {layer.layer_id}{where}", after, before))
    return handed


def check_inputs(changed: Sequence[List[str]]) -> InputsCheck:
    """From what inputs_figures finished to (one list per comparison)."""
    lines = [line for part in changed for line in part]
    return InputsCheck(not lines, lines)
