"""Dense attention (MHA, GQA, MQA): K and V caches of their own, num_kv_heads each, head_dim wide."""
from __future__ import annotations

NAME = "dense"
LABEL = "dense"
FIELDS = ()
PARAMETERS = ()


def VALUES(case):
    return None


def APPLIES(case) -> bool:
    return True


def PROBLEM(case):
    return None


def GEOMETRY(case):
    from kit.engine.kinds import Geometry
    return Geometry(heads=case.num_kv_heads, k_width=case.head_dim, v_width=case.head_dim, v_in_k=False)


def VARIANT_TAG(case) -> str:
    return ""


def FUZZ(draw, d) -> dict:
    return {}
