"""A tiny DECODE catalog for whole pytest sessions in a few seconds a run: five cases, four
kernel variants (first_a and first_b share one), the victim (of tests.toys.dying) in the middle."""
from kit.engine.case import MQA, Case
from kit.engine.catalog import Catalog
from kit.modes import ForwardMode

VICTIM_HEAD_DIM = 32


def _case(name: str, **kw) -> Case:
    return Case(name, ForwardMode.DECODE, **{"prefix": (4, 9), "heads": (4, 2), "head_dim": 16, "dtype": "fp32", **kw})


SMOKE = [_case("first_a"), _case("first_b", prefix=(3, 5, 7)), _case("victim", head_dim=VICTIM_HEAD_DIM),
         _case("after_a", page=4), _case("after_b", page=4, heads=MQA, prefix=(6,))]
CATALOG = Catalog({ForwardMode.DECODE: {"smoke": SMOKE, "full": SMOKE}})
