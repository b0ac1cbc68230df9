"""The kit catches every CPU-catchable mutant (but those harmless by design) with its expected failure class
(the GPU table, every mutant and every run, comes from `python -m kit.mutate`)."""
import pytest

from kit.mutation import score_isolated
from tests.mutants import MUTANTS


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.cpu and not m.harmless], ids=lambda m: m.name)
def test_mutant_is_caught(mutant):
    s = score_isolated(mutant, "tests.mutants:MUTANTS", "smoke", stop_when_caught=True)
    assert s.caught, (f"{mutant.name} ({mutant.doc}) missed: expected {mutant.expect}, "
                      f"{s.failed}/{s.runs} runs failed with {s.classes or 'nothing'}")


def test_catalog_is_sound():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    assert set(m.number for m in MUTANTS) >= set(range(1, 16)), "every bug class of the issue has a mutant"
    for m in MUTANTS:
        assert m.doc, f"{m.name}: the mutant's docstring names its bug class"
