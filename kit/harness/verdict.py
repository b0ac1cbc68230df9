"""A verdict: the checks of one eager step or one replay (kit/harness/checks.py,
kit/harness/guard.py), each by name, and the failure class they add up to. A new check
is one more field of Verdict, made in eager_verdict / replay_verdict."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch

from kit.engine.fixture import Fixture
from kit.engine.numerics import EXACT_NUMERICS, Numerics
from kit.engine.transfer import to_device
from kit.harness.checks import (Check, FormCheck, InputsCheck, KVCheck, KVState, LseCheck, OutputCheck,
                                PaddingCheck, Pending, StateCheck, check_form, check_inputs, check_state,
                                handed_inputs, inputs_figures, kv_figures, lse_figures, output_figures,
                                padding_figures, read_back)
from kit.harness.invariance import InvarianceCheck, Recurrence
from kit.harness.program import Program
from kit.report.record import GRAPH, KERNEL, KV_WRITE

# When several checks fail, the class that says where to look first: a wrong KV pool
# explains a wrong output, not the other way round.
PRECEDENCE = (KV_WRITE, KERNEL, GRAPH)


@dataclasses.dataclass
class Verdict:
    outputs: List[OutputCheck]  # each step's output of each layer against its golden, in step then layer order
    kv: KVCheck  # the KV pool of every layer
    forms: List[FormCheck]  # each output's shape, dtype and device
    memory: Check  # writes past what the backend allocated (kit.harness.guard.GuardCheck)
    inputs: Optional[InputsCheck] = None  # q, k and v as forward() was handed them
    state: Optional[StateCheck] = None  # a replay: the tensors the captured graph reads were kept
    padding: Optional[PaddingCheck] = None  # a replay: its padded rows
    invariance: Optional[InvarianceCheck] = None  # its requests seen in an earlier batch of the run
    # each step's log-sum-exp of each layer against the reference's, as `outputs` (a backend that declares
    # returns_lse; else none)
    lses: List[LseCheck] = dataclasses.field(default_factory=list)

    @property
    def checks(self) -> List[Check]:
        """Every check, in the order messages name them."""
        return [*self.outputs, *self.lses, self.kv, *self.forms, self.memory,
                *(c for c in (self.inputs, self.state, self.padding, self.invariance) if c is not None)]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def text(self) -> str:
        return "; ".join(c.describe() for c in self.checks if not (c.quiet and c.ok))

    @property
    def max_err(self) -> float:
        return max(c.max_err for c in self.outputs)

    @property
    def tol(self) -> float:
        return min(c.tol for c in self.outputs)

    def margins(self, num_layers: int) -> List[float]:
        """Per layer id, its worst output's or log-sum-exp's error over its limit (OutputCheck.excess,
        LseCheck.excess) over the steps."""
        return [max(c.excess for c in self.outputs[layer::num_layers] + self.lses[layer::num_layers])
                for layer in range(num_layers)]

    def failure_class(self, eager_is_right: bool = False) -> str:
        """The run's class; with eager_is_right, the class of a replay whose batch runs right eagerly."""
        classes = {c.graph_class if eager_is_right else c.failure_class for c in self.checks if not c.ok}
        return min(classes, key=PRECEDENCE.index)

    @property
    def shown_alone(self) -> bool:
        """Whether a failing check judges the batch alone (not against the run's other batches): running
        it again alone (a fresh instance) can tell more."""
        return any(not c.ok and c.alone for c in self.checks)

    @property
    def needs_eager_diagnosis(self) -> bool:
        """False when only replay-only checks fail (padded rows: eager has none to compare), or checks
        against the run's other batches."""
        return any(not c.ok and c.alone and not c.replay_only for c in self.checks)


def _labels(fx: Fixture) -> List[List[str]]:
    """Per step, per layer: how messages name an output ("layer 1 ", "step 2, layer 1 ")."""
    many = len(fx.steps) > 1
    return [[(f"step {step.index + 1}, " if many else "") + f"layer {layer.layer_id} " for layer in fx.layers]
            for step in fx.steps]


def kv_state(fx: Fixture, scratch: bool) -> KVState:
    """What the pool must hold after fx's program: the cached tokens as installed, every step's
    new tokens at their slots."""
    device = fx.pools.token_to_kv_pool.device
    loc = to_device([s for step in fx.steps for s in step.plan.new_slots], device, torch.int64)
    writes = {layer.layer_id: (_joined([step.inputs[layer.layer_id].k_new for step in fx.steps]),
                               _joined([step.inputs[layer.layer_id].v_new for step in fx.steps]))
              for layer in fx.layers}
    return KVState(fx.old_slots(), fx.installed_kv(), loc, writes, scratch)


@dataclasses.dataclass
class Across:
    """The run a batch belongs to, for the checks against its other batches: which batch this is (as
    messages name it) and the requests seen so far (kit.harness.invariance)."""

    recurrence: Recurrence
    where: str


def _joined(parts: List[torch.Tensor]) -> torch.Tensor:
    """Every step's part, in step order (one step's as it is: V a view of K stays one)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def numerics_steps(fx: Fixture, numerics: Numerics) -> Tuple[str, ...]:
    """The steps of the backend's declared numerics fx's case takes (kit.engine.numerics)."""
    return numerics.case_steps(fx.case, fx.program_inputs[0].q.device.type)


def _judged(fx: Fixture, program: Program, memory: Pending, inputs: Sequence[Pending],
            scratch: bool, padding: Optional[Pending] = None, across: Optional[Across] = None,
            numerics: Numerics = EXACT_NUMERICS) -> dict:
    """The checks of a program by name (Verdict's fields), read back from the device at once:
    each step's output of each layer against its golden, the KV pool of every layer, each
    output's form, `memory`, the inputs forward() was handed (`inputs`:
    kit.harness.checks.inputs_figures), for a replay `padding`, and within a run (`across`) the rows
    of requests seen in its earlier batches; the outputs (and the log-sum-exps forward() returned beside
    them: `program`, kit.harness.program.forward_program's) under the backend's declared `numerics`."""
    outs, lses = program
    labels = _labels(fx)
    refs = [step.reference(layer.layer_id) for step in fx.steps for layer in fx.layers]
    steps = numerics_steps(fx, numerics)
    emulated = [step.declared(layer.layer_id, steps) if steps else None for step in fx.steps for layer in fx.layers]
    flat_outs = [o for step in outs for o in step]
    flat_labels = [label for step in labels for label in step]
    pending = dict(
        outputs=output_figures(flat_outs, [r[0] for r in refs], [r[1] for r in refs], fx.case.torch_dtype, flat_labels,
                               emulated),
        kv=kv_figures(fx.pools.token_to_kv_pool, kv_state(fx, scratch)),
        memory=memory)
    returned = [(lse, step.lse(layer.layer_id, steps), label) for step, step_lses, step_labels
                in zip(fx.steps, lses, labels) for layer, lse, label in zip(fx.layers, step_lses, step_labels)
                if lse is not None]
    if returned:
        pending["lses"] = lse_figures(*zip(*returned))
    if padding is not None:
        pending["padding"] = padding
    recurring = across.recurrence.figures(fx, outs, across.where) if across is not None else None
    if recurring is not None:
        pending["invariance"] = recurring
    done = read_back(list(pending.values()) + list(inputs))
    judged = dict(zip(pending, done))
    if recurring is not None:
        judged["invariance"] = across.recurrence.check(judged["invariance"], judged["outputs"], len(fx.layers),
                                                       len(fx.steps) > 1)
    judged["inputs"] = check_inputs(done[len(pending):])
    judged["forms"] = [check_form(out, step.inputs[layer.layer_id].q, label=label, v_head_dim=layer.v_head_dim)
                       for step, step_outs, step_labels in zip(fx.steps, outs, labels)
                       for layer, out, label in zip(fx.layers, step_outs, step_labels)]
    return judged


def eager_verdict(fx: Fixture, program: Program, memory: Pending,
                  given: Sequence[Sequence[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]],
                  scratch: bool = True, across: Optional[Across] = None,
                  numerics: Numerics = EXACT_NUMERICS, padded: Optional[Sequence[torch.Tensor]] = None) -> Verdict:
    """`program`: per step, forward's output (and log-sum-exp, or None) for each layer of the model, in
    layer order (kit.harness.program.forward_program); `memory`:
    the guard's canaries (kit.harness.guard.canary_figures); `given`: per step, the (q, k, v) each
    layer's forward was handed (copies of the step's inputs); `scratch`: slot 0 is the engine's
    scratch slot (kit.engine.profile); `across`: the run's batches so far; `numerics`: the backend's
    declared numerics, the outputs judged under them; `padded`: where the step ran padded to a
    graph's rows, the outputs of its padded rows (kit.harness.checks.padding_figures)."""
    many = len(fx.steps) > 1
    handed = [h for step, step_given in zip(fx.steps, given)
              for h in handed_inputs(step, step_given, f", step {step.index + 1}" if many else "")]
    padding = None if padded is None else padding_figures(padded, fx.pools.token_to_kv_pool)
    return Verdict(**_judged(fx, program, memory, [inputs_figures(handed)], scratch, padding, across=across,
                             numerics=numerics))


def replay_verdict(fx: Fixture, replayed, scratch: bool = True, across: Optional[Across] = None,
                   numerics: Numerics = EXACT_NUMERICS) -> Verdict:
    """`replayed`: kit.harness.graph.Replayed."""
    judged = _judged(fx, (replayed.outs, replayed.lses), replayed.memory, replayed.inputs, scratch,
                     padding_figures(replayed.padded, fx.pools.token_to_kv_pool), across, numerics)
    return Verdict(**judged, state=check_state(replayed.replaced))


def replay_failure(replay: Verdict, eager: Optional[Verdict]) -> Tuple[str, str]:
    """(class, the explanation after the replay's text) of a failing replay; `eager` is the
    same batch run eagerly on a fresh backend, when the replay's failure calls for it."""
    if eager is None:
        cls = replay.failure_class()
        return cls, f" -> {cls}"
    if eager.ok:
        cls = replay.failure_class(eager_is_right=True)
        return cls, f"; eager on the same batch is right -> {cls}"
    cls = eager.failure_class()
    return cls, f"; eager on the same batch is wrong too ({eager.text}) -> {cls}"
