"""The attention kinds, registered once: one file per kind (`dense.py`, `mla.py`, `sparse_mla.py`),
each holding an `AttentionKind`'s parts by name. A kind declares its own parameters (fields every
case gets, kit.engine.case, at their defaults where the case is of another kind), says which case
fields are its own and checks them, the pool geometry its KV takes (heads and K / V widths, V a
view of K or not), how a request's K and V are drawn, the tag it adds to a kernel variant, its fuzz
draws, and how a reason names it. Importing this module imports no torch (cases check themselves
against their kind)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

from kit.engine.kinds import dense, mla, sparse_mla


@dataclasses.dataclass(frozen=True)
class Geometry:
    """One layer's KV as a pool holds it: heads, the width of K and of V per head, and whether V
    is a view of K's leading columns (MLA's latent) rather than values of its own."""

    heads: int
    k_width: int
    v_width: int
    v_in_k: bool


@dataclasses.dataclass(frozen=True)
class AttentionKind:
    name: str  # Case.kind, and what a backend's `attention_kinds` lists
    label: str  # how a reason names it
    fields: Tuple[str, ...]  # the Case fields of this kind alone (0 in every other kind)
    parameters: Tuple[Tuple[str, object], ...]  # (name, default) of the Case fields it adds
    values: Callable  # (case) -> what is wrong with its parameters' values whatever the case's kind, or None
    applies: Callable  # (case) -> whether the case is of this kind
    problem: Callable  # (case) -> what is wrong with the case's fields for this kind, or None
    geometry: Callable  # (case) -> Geometry
    variant_tag: Callable  # (case) -> what it adds to Case.kernel_variant ("" for nothing)
    fuzz: Callable  # (draw, drawing) -> the case fields it draws (kit.fuzz.strategies)


def _kind(module) -> AttentionKind:
    return AttentionKind(**{f.name: getattr(module, f.name.upper()) for f in dataclasses.fields(AttentionKind)})


# In the order a case is matched against them: the first whose `applies` holds is the case's.
KINDS: Dict[str, AttentionKind] = {k.name: k for k in (_kind(sparse_mla), _kind(mla), _kind(dense))}


def parameters() -> Tuple[Tuple[str, object], ...]:
    """Every kind's parameters, the plainest kind's first (the Case fields they add, in order)."""
    return tuple(p for kind in reversed(KINDS.values()) for p in kind.parameters)


def kind_of(case) -> AttentionKind:
    for kind in KINDS.values():
        if kind.applies(case):
            return kind
    raise ValueError(f"case {case.name!r} is of no attention kind")


def label(name: str) -> str:
    """How a reason names the kind `name` (its own name where it is not one of the kit's)."""
    from kit.engine.kinds import recurrent  # here: it imports this package's kinds

    kind: Optional[AttentionKind] = KINDS.get(name)
    return kind.label if kind else recurrent.KINDS[name].LABEL if name in recurrent.KINDS else name
