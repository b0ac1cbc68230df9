"""Which pairs of feature values a set of cases reaches, per mode: the catalog's covering check.

A feature is a property of a case that a backend's code branches on (kit.engine.features: its
values, a case's value, and the fields that give a case that value). A bug that needs two of them (an fp8
cache read through a sliding window) is reached only by a case that has both, so every pair of
values of two features must be some case's. A pair is possible in a mode when a case of the mode
can have both: `Case` validation decides (the rules of the mode and of the attention kind: MLA
takes no window, only the speculative modes have trees), on a probe of the mode with the two values
set, and so does the draft rule of the catalog's engine (the in-box catalog's drafts are SGLang's,
kit.engine.drafts, which vLLM's rule takes too: no DRAFT_DECODE tree at pages > 1).
`missing` lists the possible pairs a set of cases leaves out; `covering` proposes cases that reach
them, densest first (a greedy covering array over the missing pairs)."""
from __future__ import annotations

import itertools
from typing import Dict, Iterable, List, Sequence, Tuple

from kit.engine.case import Case
from kit.engine import features
from kit.engine.kinds import parameters as kind_parameters
from kit.engine.kinds.recurrent import RecurrentCase
from kit.engine.profile import SGLANG, EngineProfile


def paired(case_type: type) -> Tuple[features.Feature, ...]:
    """The features of `case_type`'s cases every pair of whose values some case must have (kit.engine.features)."""
    return tuple(f for f in features.FEATURES if f.paired and f.case is case_type)


BY_NAME = {f.name: f for f in features.FEATURES if f.paired}
# Per sort of case, the feature naming its attention kind, and the fields a kind's cases differ in (taken
# from an example case of the kind): its heads and widths, and every softmax kind's own parameters.
KIND_FEATURE = {Case: "kind", RecurrentCase: "linear_kind"}
KIND_FIELDS = {Case: ("heads", "head_dim", "scale") + tuple(name for name, _ in kind_parameters()),
               RecurrentCase: ("kind", "heads", "head_k_dim", "head_v_dim")}

Value = Tuple[str, object]  # (feature name, value)
Pair = Tuple[Value, Value]  # in the feature table's order


def values_of(case) -> Tuple[Value, ...]:
    return tuple((f.name, f.of(case)) for f in paired(type(case)))


def pairs_of(case) -> Iterable[Pair]:
    return itertools.combinations(values_of(case), 2)


def describe(pair: Pair) -> str:
    return " & ".join(f"{name}={value}" for name, value in pair)


class Probe:
    """Cases of one mode built to order: a template of the mode (its lengths) with feature values
    set; the attention kinds' fields come from an example case of each kind (any mode)."""

    def __init__(self, template, examples: Dict[str, object], engine: EngineProfile = SGLANG):
        self.template = template
        self.engine = engine  # whose draft rule the catalog's cases follow
        sort = type(template)
        self.features, self.kind_feature = paired(sort), KIND_FEATURE[sort]
        self.kinds = {kind: {f: getattr(example, f) for f in KIND_FIELDS[sort]} for kind, example in examples.items()
                      if isinstance(example, sort)}
        self.plain = {f.name: f.values[0] for f in self.features}

    def case(self, values: Dict[str, object]) -> Case:
        """A case of the template's mode with `values` (the rest plain, but those fitted to its lengths,
        which keep the template's), or ValueError where no case of the template's lengths has them."""
        chosen = dict(self.plain, **values)
        kind = chosen[self.kind_feature]
        if kind not in self.kinds:
            raise ValueError(f"no example case of attention kind {kind!r} in the catalog")
        fields = dict(self.kinds[kind])
        for f in self.features:
            fields.update(f.fields(chosen[f.name]))
        if isinstance(self.template, Case):
            fields["request_seeds"] = None
        case = self.template.with_(name="probe", **fields)
        for f in self.features:  # a value fitted to the case's lengths: asked for, or the plain one left as it comes
            if f.fit is not None and f.name in values:
                case = case.with_(**f.fit(case, values[f.name]))
        wrong = [name for name, value in values.items() if BY_NAME[name].of(case) != value]
        if wrong:
            raise ValueError(f"no case of the template's lengths has {', '.join(f'{n}={values[n]}' for n in wrong)}")
        return case

    def possible(self, values: Dict[str, object]) -> bool:
        try:
            case = self.case(values)
        except ValueError:
            return False
        return not isinstance(case, Case) or self.engine.draft_problem(case) is None


def probe_for(cases: Sequence[Case], every_case: Sequence[Case]) -> Probe:
    """The probe of the mode of `cases`: its smallest case as the template, an example of each
    attention kind from `every_case` (a kind may have cases in some modes only)."""
    examples = {}
    for case in sorted(every_case, key=lambda c: c.size):
        examples.setdefault(case.kind, case)
    return Probe(min(cases, key=lambda c: c.size), examples)


def possible_pairs(probe: Probe) -> List[Pair]:
    """Every pair of values of two features some case of the probe's mode can have."""
    pairs = []
    for f, g in itertools.combinations(probe.features, 2):
        for a, b in itertools.product(f.values, g.values):
            if probe.possible({f.name: a, g.name: b}):
                pairs.append(((f.name, a), (g.name, b)))
    return pairs


def missing(cases: Sequence[Case], probe: Probe) -> List[Pair]:
    """The possible pairs no case of `cases` reaches."""
    reached = {pair for case in cases for pair in pairs_of(case)}
    return [pair for pair in possible_pairs(probe) if pair not in reached]


def covering(gaps: Sequence[Pair], probe: Probe) -> List[Tuple[Dict[str, object], List[Pair]]]:
    """Feature values of cases that together reach every pair of `gaps`, each with the pairs it
    reaches, densest first: each the valid assignment of every feature that reaches most of the
    pairs still left (a greedy covering)."""
    left = set(gaps)
    names = [f.name for f in probe.features]
    candidates = [dict(zip(names, values)) for values in itertools.product(*(f.values for f in probe.features))
                  if any(((names[i], values[i]), (names[j], values[j])) in left
                         for i, j in itertools.combinations(range(len(names)), 2))]
    chosen = []
    while left:
        best, reached = None, []
        for values in candidates:
            hits = [p for p in itertools.combinations(tuple(values.items()), 2) if p in left]
            if len(hits) > len(reached) and probe.possible(values):
                best, reached = values, hits
        if best is None:
            break  # no valid case reaches what is left (possible_pairs never leaves such a pair)
        chosen.append((best, reached))
        left -= set(reached)
    return chosen
