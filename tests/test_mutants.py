"""The kit catches every CPU-catchable mutant (but those harmless by design) with its expected failure class
(the GPU table, every mutant and every run, comes from `python -m kit.mutate`)."""
import pytest

from kit.engine.catalog import load_catalog
from kit.modes import parse_mode
from kit.mutation import score, score_isolated
from kit.report.record import CRASH, parse_run_id
from tests.mutants import MUTANTS


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.cpu and not m.harmless], ids=lambda m: m.name)
def test_mutant_is_caught(mutant):
    # In this process (a new one costs seconds of imports), but for a mutant that may take it down.
    s = (score_isolated(mutant, "tests.mutants:MUTANTS", "smoke", stop_when_caught=True) if CRASH in mutant.expect
         else score(mutant, "smoke", stop_when_caught=True))
    assert s.caught, (f"{mutant.name} ({mutant.doc}) missed: expected {mutant.expect}, "
                      f"{s.failed}/{s.runs} runs failed with {s.classes or 'nothing'}")
    if mutant.reaches is not None:  # tried first: a catch elsewhere means the catalog says the wrong cases
        _, mode, _, name = parse_run_id(s.first_failure)
        assert mutant.reaches(load_catalog(None).find_case(parse_mode(mode), name)), (
            f"{mutant.name} was caught at {s.first_failure}, in a case its `reaches` leaves out")


def test_catalog_is_sound():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    assert set(m.number for m in MUTANTS) >= set(range(1, 16)), "every bug class of the issue has a mutant"
    for m in MUTANTS:
        assert m.doc, f"{m.name}: the mutant's docstring names its bug class"
