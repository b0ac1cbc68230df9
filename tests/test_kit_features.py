"""The case features' table (kit.engine.features) is what the pairs check, drawn names and shrinking
read: each row's fields (fitted to the case's lengths where its `fit` says) give a case the value its
`of` reads back, and a drawn case's name says exactly the features that are on."""
import pytest

from cases.mla import SMALL_SPARSE_MLA
from kit.engine.features import FEATURES
from kit.engine.kinds.recurrent import RecurrentCase
from kit.fuzz.strategies import case_name
from kit.modes import ForwardMode
from tests.helpers import small_case

BASE = small_case("base", ForwardMode.TARGET_VERIFY, prefix=(5, 7), new=3)
# A feature's values all possible on the base: rows to order (EXTEND), a sparse case's index rows.
SPARSE = BASE.with_(mode=ForwardMode.EXTEND, new=(3, 2), page=16, **SMALL_SPARSE_MLA)
BASES = {"row_order": BASE.with_(mode=ForwardMode.EXTEND, new=(3, 2)), "index_scatter": SPARSE,
         "index_padded": SPARSE}
# A recurrent feature's values all possible on an EXTEND of a new request and a saved one; a verify's drafts.
LINEAR = RecurrentCase("linear", ForwardMode.EXTEND, prefix=(0, 5), new=(3, 4), heads=(1, 2), head_k_dim=16,
                       head_v_dim=32, dtype="fp32")
BASES["rejected"] = LINEAR.with_(mode=ForwardMode.TARGET_VERIFY, new=3, accepted=(3, 3))


def _given(feature, value):
    case = BASES.get(feature.name, BASE if feature.case is not RecurrentCase else LINEAR).with_(**feature.fields(value))
    return case.with_(**feature.fit(case, value)) if feature.fit else case


@pytest.mark.parametrize("feature", [f for f in FEATURES if f.name not in ("kind", "linear_kind")], ids=lambda f: f.name)
def test_each_value_of_a_feature_is_what_its_fields_give(feature):
    for value in feature.values:
        case = _given(feature, value)
        assert feature.of(case) == value and feature.on(case) == (value != feature.values[0])


def _name(case):
    return case_name(case, {k: v for k, v in vars(case).items() if k not in ("name", "mode")})


def test_a_drawn_name_tags_the_features_on():
    tagged = [f for f in FEATURES if f.tag]
    for f in tagged:
        words = _name(_given(f, f.values[-1])).split("_")
        assert f.tag.split("_")[0] in words, (f.name, words)
    for base in (BASE, LINEAR):
        plain = _name(base).split("_")
        assert not {f.tag.split("_")[0] for f in tagged} & set(plain), plain
