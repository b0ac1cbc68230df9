"""A recurrent case's run (GDN, Mamba2, KDA), as the matrix's runner hands it over (record_run): its step, eagerly or as a graph runner pads it, then (TARGET_VERIFY) the step
after it, judged as the softmax runs are: every layer's output of the real rows against the
float64 reference (kit.harness.checks.output_figures), padded rows finite, the output's form, and
the state pools (kit.harness.state_checks).

TARGET_VERIFY follows the engine's rollback rule, its profile's (kit.harness.recurrent_rules):
SGLang's writes the state after each draft to the intermediate pools, at the request's batch
position, and leaves the request's own slot as it was, the scheduler (here the kit) then copying the
state of the last draft a request keeps into its slot; vLLM's writes it to the request's block of that token, and the next step
reads block num_accepted_tokens - 1. Each request keeps its own count (RecurrentCase.accepted), and
that next step, a DECODE, is judged too: a backend that wrote draft n's state where draft n + 1's
belongs is caught there even if its verify outputs are right.

Graph mode: the batch padded to the next larger batch-size bucket (padded rows: the backend's
`padded_state_slot`, kit.engine.state_pool), captured and replayed on CUDA (torch.cuda.CUDAGraph over the kit's static
inputs); without CUDA, the capture's calls run and the replay's calls run again on the same
instance (kit.harness.step_graph). A padded row's state slot must stay untouched (the pools' check
covers every slot). A hybrid model's graph holds every layer of the step, full and linear, its full
layers' batch padded to as many requests (kit.harness.hybrid.FullLayers.graph_step).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from kit.engine.numerics import EXACT_NUMERICS, RECURRENT_CASTS, label
from kit.engine.recurrent_step import RecurrentBatch, RecurrentFixture, build, kept_draft
from kit.engine.kinds.recurrent import RecurrentCase
from kit.engine.state_pool import PADDED_SLOT, StatePool
from kit.harness.checks import Check, output_figures, read_back
from kit.harness.fault import raised
from kit.harness.hybrid import FullLayers
from kit.harness.nan_fill import nan_filled_allocations
from kit.harness.recurrent_rules import IntermediatePools, rule_of
from kit.harness.scope import recurrent_graph_reason
from kit.harness.step_graph import graphed
from kit.harness.state_checks import Expected, StatePoolCheck, check_states
from kit.modes import Exec, ForwardMode
from kit.report.record import CRASH, CUDA_GRAPH, EAGER, EMULATED, FAIL, GRAPH, KERNEL, KV_WRITE, RunResult

PRECEDENCE = (CRASH, KV_WRITE, KERNEL, GRAPH)


@dataclasses.dataclass
class RecurrentContext:
    """What a recurrent backend is built with."""

    device: torch.device
    dtype: torch.dtype
    state_pool: StatePool
    layers: tuple  # RecurrentLayer, by layer_id
    max_bs: int  # the largest batch a graph of the run holds
    drafts: int = 0  # TARGET_VERIFY's tokens a request (the speculative config: drafts verified at once)


@dataclasses.dataclass
class PaddedRowsCheck(Check):
    nonfinite: int

    def describe(self) -> str:
        return "padded rows finite" if self.ok else f"{self.nonfinite} padded output rows NaN/inf"


@dataclasses.dataclass
class Crashed(Check):
    failure_class = CRASH
    error: str

    def describe(self) -> str:
        return f"raised {self.error}"


@dataclasses.dataclass
class FormsCheck(Check):
    problems: List[str]

    def describe(self) -> str:
        return "output forms ok" if self.ok else "output form wrong: " + "; ".join(self.problems)


@dataclasses.dataclass
class RecurrentVerdict:
    step: str  # which step of the run
    checks: List[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failure_class(self) -> str:
        return min((c.failure_class for c in self.checks if not c.ok), key=PRECEDENCE.index)

    @property
    def text(self) -> str:
        return f"{self.step}: " + "; ".join(c.describe() for c in self.checks if not c.ok)


def padded_bucket(bs: int, profile) -> int:
    """The graph's batch size: the smallest of the engine's buckets larger than bs (a padded row at least)."""
    return next(b for b in profile.batch_sizes if b > bs)


def _expected(fx: RecurrentFixture, rule=IntermediatePools, before_verify=None) -> List[Expected]:
    """The entries the step writes, as the engine's verify rule keeps them."""
    return rule.expected(fx, before_verify)


def _call(backend, batch: RecurrentBatch, inputs, layers) -> List[torch.Tensor]:
    backend.init_forward_metadata(batch)
    return [backend.forward(*x.handed(), layer, batch) for x, layer in zip(inputs, layers)]


def _graphed(backend, batch: RecurrentBatch, inputs, layers, refill: Callable[[], None]) -> List[torch.Tensor]:
    """Capture the step's calls, refill the pools as before the step, replay: the replay's outputs."""
    return graphed(batch.state_indices.device.type == "cuda", lambda: backend.init_forward_metadata(batch), None,
                   lambda: [backend.forward(*x.handed(), layer, batch) for x, layer in zip(inputs, layers)], refill)


def _judge(fx: RecurrentFixture, pool: StatePool, before, outs: List[torch.Tensor], step: str, rule, profile,
           before_verify=None) -> RecurrentVerdict:
    """The step's checks; padded rows judged (finite) only where a padded token belongs to a request
    (profile.padded_rows_attend), as the softmax harness judges them."""
    real = sum(fx.case.new_lens)
    dtype = fx.torch_dtype
    hv, dv = fx.case.heads[1], fx.case.head_v_dim
    problems = [f"layer {layer.layer_id} output {tuple(o.shape)} {o.dtype} on {o.device}, "
                f"not [>= {real}, {hv}, {dv}] {dtype}" for layer, o in zip(fx.layers, outs)
                if o.dim() != 3 or o.shape[0] < real or tuple(o.shape[1:]) != (hv, dv) or o.dtype != dtype]
    goldens = [torch.cat([r.out for r in runs]) for runs in fx.golden]
    sames = [torch.cat([r.out for r in runs]).to(dtype) for runs in fx.same_dtype]
    declared = ([(g, torch.cat([r.out for r in runs])) for g, runs in zip(goldens, fx.envelope)]
                if fx.envelope else None)
    outputs = read_back([output_figures([o[:real] for o in outs], goldens, sames, dtype,
                                        [f"layer {layer.layer_id} " for layer in fx.layers], declared)])[0]
    padded = sum(int((~torch.isfinite(o[real:].float())).any(dim=-1).any(dim=-1).sum()) for o in outs
                 if o.dim() == 3) if profile.padded_rows_attend else 0
    states: StatePoolCheck = check_states(pool, before, _expected(fx, rule, before_verify), dtype)
    return RecurrentVerdict(step, [*outputs, FormsCheck(not problems, problems), PaddedRowsCheck(not padded, padded), states])


def declared_casts(backend_cls, case: RecurrentCase, device: str) -> Tuple[Tuple[str, ...], ...]:
    """Per request of `case`, the recurrent casts of the backend's declared numerics (kit.engine.numerics)
    its rows take on `device`: those of the mode whose kernels the backend runs the request in (its
    `request_modes(case)`, where it declares one: an engine that splits a step into decode and prefill
    requests; the case's mode otherwise)."""
    numerics = getattr(backend_cls, "numerics", EXACT_NUMERICS)
    request_modes = getattr(backend_cls, "request_modes", None)
    modes = request_modes(case) if request_modes else [case.mode.value] * case.bs
    device_type = torch.device(device).type
    # (attention's head sharing and latent rows are no recurrent layer's)
    return tuple(tuple(s for s in numerics.steps(mode, case.dtype, None, device_type, grouped=True, latent=False)
                       if s in RECURRENT_CASTS)
                 for mode in modes)


def casts_taken(casts: Sequence[Sequence[str]]) -> Tuple[str, ...]:
    """The casts any request takes, in RECURRENT_CASTS order (what a record names)."""
    return tuple(c for c in RECURRENT_CASTS if any(c in request for request in casts))


def _snapshot(pool: StatePool):
    return {name: b.clone() for name, b in pool.buffers.items()}


def run_case(backend_cls, case: RecurrentCase, exec_: Exec = Exec.EAGER, device: str = "cpu") -> List[RecurrentVerdict]:
    """Every step's verdict (one, or a verify's and the step after it); a step that raises ends the
    run with a `crash` verdict naming the error."""
    not_captured = recurrent_graph_reason(case) if exec_ == Exec.GRAPH else None
    if not_captured:
        raise ValueError(not_captured)
    verdicts: List[RecurrentVerdict] = []
    try:
        with nan_filled_allocations():  # rows a backend never writes read NaN, not what memory held
            _run(backend_cls, case, exec_, device, verdicts)
    except Exception as exc:  # the backend's error is the run's verdict, as the softmax runner's
        verdicts.append(RecurrentVerdict(f"{case.mode.value} {exec_.value}",
                                         [Crashed(False, raised(exc))]))
    return verdicts


def _run(backend_cls, case: RecurrentCase, exec_: Exec, device: str, verdicts: List[RecurrentVerdict]) -> None:
    rule = rule_of(backend_cls.profile)
    fx = build(case, device, layout=rule.layout(case), casts=declared_casts(backend_cls, case, device))
    pool = StatePool(fx.geometry, fx.torch_dtype, device)
    graph = exec_ == Exec.GRAPH
    max_bs = padded_bucket(case.bs, backend_cls.profile) if graph else case.bs
    drafts = case.new if case.mode == ForwardMode.TARGET_VERIFY else 0
    ctx = RecurrentContext(torch.device(device), fx.torch_dtype, pool, fx.layers, max_bs, drafts)
    full, full_next = FullLayers.of_run(backend_cls, case, device) if case.layer_pattern else (None, None)
    backend = backend_cls(full.context(device, ctx) if full else ctx)
    batch, inputs = fx.batch(device, max_bs if graph else None, getattr(backend_cls, "padded_state_slot", PADDED_SLOT),
                             empty_padding=backend_cls.profile.padded_query_len == 0)

    def refill():
        pool.reset()
        fx.install(pool)

    refill()
    before = _snapshot(pool)
    if graph and hasattr(backend, "init_cuda_graph_state"):
        backend.init_cuda_graph_state(max_bs)
    if full:
        outs, attention = (full.graph_step(backend, batch, inputs, fx.layers, refill) if graph
                           else full.step(backend, batch, inputs, fx.layers))
        verdicts.append(RecurrentVerdict(f"{case.mode.value} {exec_.value}, {full.describe()}", attention.checks))
    elif graph:
        outs = _graphed(backend, batch, inputs, fx.layers, refill)
    else:
        outs = _call(backend, batch, inputs, fx.layers)
    verdicts.append(_judge(fx, pool, before, outs, f"{case.mode.value} {exec_.value}", rule, backend_cls.profile))
    if case.mode == ForwardMode.TARGET_VERIFY:
        verdicts.extend(_after_verify(backend, fx, pool, device, rule, full_next))


def _after_verify(backend, fx: RecurrentFixture, pool: StatePool, device, rule,
                  full: Optional[FullLayers]) -> List[RecurrentVerdict]:
    """The decode step after the verify, each request continuing from the last draft it keeps (a
    hybrid model's full layers too: their verdict first)."""
    case = fx.case
    accepted = case.accepted
    rule.after_verify(fx, pool, accepted)
    follow = case.after_verify()
    nxt = build(follow, device, starts=kept_draft(fx, accepted), blocks=fx.blocks, layers=fx.layers,
                layout=rule.next_layout(fx, accepted), casts=declared_casts(backend, follow, device))
    before = _snapshot(pool)
    batch, inputs = nxt.batch(device)
    step = f"the decode after the verify (accepted {list(accepted)})"
    verdicts = []
    if full:
        outs, attention = full.step(backend, batch, inputs, nxt.layers)
        verdicts.append(RecurrentVerdict(f"{step}, {full.describe()}", attention.checks))
    else:
        outs = _call(backend, batch, inputs, nxt.layers)
    return verdicts + [_judge(nxt, pool, before, outs, step, rule, backend.profile, before_verify=fx)]


def failures(verdicts: List[RecurrentVerdict]) -> Optional[str]:
    """The run's failure message, or None where every step passed."""
    bad = [v for v in verdicts if not v.ok]
    return " | ".join(f"{v.failure_class}: {v.text}" for v in bad) if bad else None


def record_run(backend_cls, case: RecurrentCase, exec_: Exec, device: str, result: RunResult) -> None:
    """`case`'s run into the matrix's record of it (kit.harness.runner): how it executed and, where a
    step failed, the first failing step's class and every failing step's message."""
    on_cuda = torch.device(device).type == "cuda"
    result.exec_detail = EAGER if exec_ == Exec.EAGER else CUDA_GRAPH if on_cuda else EMULATED
    result.numerics = label(casts_taken(declared_casts(backend_cls, case, device)))
    verdicts = run_case(backend_cls, case, exec_, device)
    bad = [v for v in verdicts if not v.ok]
    if bad:
        result.outcome, result.failure_class, result.message = FAIL, bad[0].failure_class, failures(verdicts)


def main(argv=None) -> int:
    """`python -m kit.harness.recurrent`: every run of a catalog's recurrent cases on one backend,
    a line each; exit 1 if any failed."""
    import argparse
    import time

    from kit.targets import import_target

    parser = argparse.ArgumentParser(prog="python -m kit.harness.recurrent", description=main.__doc__)
    parser.add_argument("--backend", default="backends.torch_native_linear:TorchNativeLinearBackend")
    parser.add_argument("--cases", default="cases.linear", help="a module with SMOKE and FULL lists")
    parser.add_argument("--case-set", choices=("smoke", "full"), default="smoke")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    args = parser.parse_args(argv)
    backend = import_target(args.backend)
    cases = import_target(f"{args.cases}:{args.case_set.upper()}")
    failed = 0
    for case in (c for c in cases if args.k in c.name and c.kind in backend.attention_kinds):
        for exec_ in (e for e in Exec if e == Exec.EAGER or not recurrent_graph_reason(case)):
            start = time.time()
            message = failures(run_case(backend, case, exec_, args.device))
            failed += message is not None
            print(f"{case.name}-{exec_.value}: {'FAIL ' + message if message else 'ok'} ({time.time() - start:.1f} s)",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
