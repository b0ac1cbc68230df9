"""What a backend class declares of itself (kit.harness.protocol.DECLARATIONS, documented and
defaulted on AttentionBackend), read once when it is loaded and checked (`Capabilities.of`): the
modes, attention kinds, layer features and quantized KV caches forward() implements, its numerics
(the rounding steps it takes on purpose), whether it returns the log-sum-exp, its engine's profile,
its graph hooks, how it takes a padded EXTEND batch, and the smoke cases a plain CPU run gives it.
The harness asks this record, never the class."""
from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, Optional, Tuple

from kit.engine import kinds
from kit.engine.case import KV_DTYPES, Case
from kit.engine.kinds.recurrent import HYBRID
from kit.engine.modes import rules_for
from kit.engine.numerics import Numerics
from kit.engine.profile import BUILDER, CAPTURE_REPLAY, TWO_PHASE, EngineProfile
from kit.harness.mirrors import MIRRORS
from kit.modes import ForwardMode


# The hooks each style's graphs need (kit.harness.hooks drives them).
HOOKS = {
    TWO_PHASE: ("init_cuda_graph_state", "init_forward_metadata_out_graph"),
    CAPTURE_REPLAY: ("init_cuda_graph_state", "init_forward_metadata_capture_cuda_graph",
                     "init_forward_metadata_replay_cuda_graph"),
    BUILDER: ("init_cuda_graph_state", "build_for_capture"),
}
NO_CAPTURE_HOOKS = "no capture hooks"
FEATURES = {"sinks": "attention sinks (Layer.sinks)",
            HYBRID: "a hybrid model's full-attention layers (RecurrentCase.layer_pattern)"}  # Case.features, as a reason names them


class BadDeclaration(TypeError):
    """A backend's declaration (`modes`, `extend_capture`, ...) is not of the form the protocol says."""


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """A backend's declarations as read (each documented on kit.harness.protocol.AttentionBackend),
    and what its class implements of the graph hooks."""

    # The mode values forward() implements (a mode the protocol adds later may be named by value);
    # None: the modes whose rules say they are assumed supported (the four the protocol started with).
    modes: Optional[FrozenSet[str]]
    attention_kinds: FrozenSet[str]  # Case.kind values forward() implements ("dense", "mla")
    kv_dtypes: FrozenSet[str]  # Case.kv_dtype values (quantized KV caches) forward() reads
    attention_features: FrozenSet[str]  # Case.features forward() implements ("sinks"); none by default
    profile: EngineProfile  # the engine's conventions (kit.engine.profile)
    numerics: Numerics  # the rounding steps forward() takes on purpose (kit.engine.numerics)
    hook_style: Optional[str]  # the graph hooks' style (kit.harness.hooks); None: no graph runs ("no capture hooks")
    in_graph: bool  # two-phase: init_forward_metadata_in_graph, recorded in the graph
    extend_capture: bool  # EXTEND's forward() may be captured once per token bucket
    real_rows_only: bool  # forward() sees only the real tokens of a padded EXTEND batch
    batch_invariant: bool  # a request's output rows are the same, bit for bit, in any batch (kit.harness.invariance)
    returns_lse: bool  # forward() returns (out, lse), the log-sum-exp judged too
    # The host mirrors (kit.harness.mirrors.MIRRORS) it reads without the engine waiting to make them exact;
    # None: it needs them exact.
    host_mirrors: Optional[FrozenSet[str]]
    ci_cases: Optional[Dict[str, Tuple[str, ...]]]  # {mode value: case names} of `--case-set auto` on CPU
    own_process: Optional[str]  # why each run needs a process of its own (a subprocess each), or None

    @classmethod
    def of(cls, backend_cls) -> "Capabilities":
        """The declarations of `backend_cls` (docs/extending.md, 'Adding a backend', lists each;
        kit.harness.protocol.AttentionBackend all but `profile` and the builder-style graph hooks),
        or BadDeclaration naming the one that is malformed."""
        name = getattr(backend_cls, "__name__", repr(backend_cls))
        if not hasattr(backend_cls, "profile"):
            raise BadDeclaration(f"{name} declares no `profile`: set `profile = kit.engine.profile.SGLANG` (or the "
                                 f"EngineProfile of the engine whose conventions it follows; docs/extending.md)")
        # here: the protocol module imports torch, and the plugin's controller imports this one without it
        from kit.harness.protocol import DECLARATIONS, AttentionBackend

        declared = {d: getattr(backend_cls, d, getattr(AttentionBackend, d, None)) for d in DECLARATIONS}
        profile = declared["profile"]
        if not isinstance(profile, EngineProfile) or profile.problem():
            raise BadDeclaration(f"{name}.profile must be a kit.engine.profile.EngineProfile"
                                 + (f": {profile.problem()}" if isinstance(profile, EngineProfile) else f", not {profile!r}"))
        numerics = declared["numerics"]
        if not isinstance(numerics, Numerics) or numerics.problem():
            raise BadDeclaration(f"{name}.numerics must be a kit.engine.numerics.Numerics"
                                 + (f": {numerics.problem()}" if isinstance(numerics, Numerics) else f", not {numerics!r}"))
        for flag in ("extend_capture", "real_rows_only", "batch_invariant", "returns_lse"):
            if not isinstance(declared[flag], bool):
                raise BadDeclaration(f"{name}.{flag} must be True or False, not {declared[flag]!r}")
        if not (declared["own_process"] is None or isinstance(declared["own_process"], str) and declared["own_process"]):
            raise BadDeclaration(f"{name}.own_process must be None or why its runs need a process each, "
                                 f"not {declared['own_process']!r}")
        return cls(modes=_modes(name, declared["modes"]),
                   attention_kinds=_name_set(name, "attention_kinds", declared["attention_kinds"],
                                             _is_str, 'kinds (e.g. ("dense", "mla"))'),
                   kv_dtypes=_name_set(name, "kv_dtypes", declared["kv_dtypes"],
                                       KV_DTYPES.__contains__, f"{tuple(KV_DTYPES)} (quantized KV caches it reads)"),
                   attention_features=_name_set(name, "attention_features", declared["attention_features"],
                                                _is_str, 'features (e.g. ("sinks",))'),
                   profile=profile, numerics=numerics, hook_style=_hook_style(backend_cls, profile),
                   in_graph=callable(getattr(backend_cls, "init_forward_metadata_in_graph", None)),
                   extend_capture=declared["extend_capture"], real_rows_only=declared["real_rows_only"],
                   batch_invariant=declared["batch_invariant"], returns_lse=declared["returns_lse"],
                   ci_cases=_ci_cases(name, declared["ci_cases"]), own_process=declared["own_process"],
                   host_mirrors=_host_mirrors(name, declared["host_mirrors"]))

    def mode_reason(self, mode: ForwardMode) -> Optional[str]:
        """Why the backend does not run `mode` (its `modes` leave it out), or None."""
        runs = rules_for(mode).assumed_supported if self.modes is None else mode.value in self.modes
        return None if runs else f"the backend does not implement mode {mode.value} (its `modes` leave it out)"

    def kind_reason(self, case: Case) -> Optional[str]:
        """Why the backend does not run the case's attention kind (its `attention_kinds` leave it out), or None."""
        if case.kind in self.attention_kinds:
            return None
        return f"{kinds.label(case.kind)}: the backend does not implement it (its `attention_kinds` leave out {case.kind!r})"

    def kv_dtype_reason(self, case: Case) -> Optional[str]:
        """Why the backend does not run the case's quantized KV cache (its `kv_dtypes` leave it out), or None."""
        if case.kv_dtype is None or case.kv_dtype in self.kv_dtypes:
            return None
        return f"{case.kv_dtype} KV cache: the backend does not read it (its `kv_dtypes` leave out {case.kv_dtype!r})"

    def feature_reason(self, case: Case) -> Optional[str]:
        """Why the backend does not run a layer feature of the case (its `attention_features` leave
        it out), or None: a backend written before a feature existed would run it and ignore it."""
        missing = [f for f in case.features if f not in self.attention_features]
        if not missing:
            return None
        return (f"{', '.join(FEATURES.get(f, f) for f in missing)}: the backend does not implement them "
                f"(its `attention_features` leave out {', '.join(map(repr, missing))})")

    @property
    def has_graph_hooks(self) -> bool:
        return self.hook_style is not None


def _modes(name: str, declared) -> Optional[FrozenSet[str]]:
    if declared is None:
        return None
    if isinstance(declared, (str, ForwardMode)) or not isinstance(declared, (tuple, list, set, frozenset)):
        raise BadDeclaration(f"{name}.modes must be a tuple of ForwardMode members (or their values), "
                             f"not {declared!r}")
    values = [m.value if isinstance(m, ForwardMode) else m for m in declared]
    if not all(isinstance(v, str) for v in values):
        raise BadDeclaration(f"{name}.modes must hold ForwardMode members or their values, not {declared!r}")
    return frozenset(values)


def _name_set(name: str, attr: str, declared, ok, what: str) -> FrozenSet[str]:
    """A declaration that is a tuple of names, each `ok`, as a set; else BadDeclaration saying `what`."""
    if isinstance(declared, str) or not isinstance(declared, (tuple, list, set, frozenset)) or not all(
            ok(d) for d in declared):
        raise BadDeclaration(f"{name}.{attr} must be a tuple of {what}, not {declared!r}")
    return frozenset(declared)


def _host_mirrors(name: str, declared) -> Optional[FrozenSet[str]]:
    if declared is None:
        return None
    return _name_set(name, "host_mirrors", declared, MIRRORS.__contains__,
                     f"{MIRRORS} (the host copies it reads that the engine need not make exact), or None")


def _is_str(value) -> bool:
    return isinstance(value, str)


def _hook_style(backend_cls, profile: EngineProfile) -> Optional[str]:
    """The style the profile names, where the class implements its hooks whole; else, where the
    profile names none, the first of SGLang's two styles it implements."""
    styles = (profile.hooks,) if profile.hooks else (TWO_PHASE, CAPTURE_REPLAY)
    for style in styles:
        if all(callable(getattr(backend_cls, h, None)) for h in HOOKS[style]):
            return style
    return None


def _ci_cases(name: str, declared) -> Optional[Dict[str, Tuple[str, ...]]]:
    if declared is None:
        return None
    if not isinstance(declared, dict) or not all(
            isinstance(k, str) and isinstance(v, (tuple, list)) for k, v in declared.items()):
        raise BadDeclaration(f"{name}.ci_cases must map mode values to tuples of case names, not {declared!r}")
    return {mode: tuple(names) for mode, names in declared.items()}
