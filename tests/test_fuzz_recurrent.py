"""The fuzzer on the recurrent kinds (GDN, Mamba2, KDA: kit.engine.kinds.recurrent): a backend serving one
gets recurrent cases drawn over every recurrent feature (kit.engine.features), each reading back from its
line; a failure shrinks to fewer requests and shorter lengths; and a planted chunk-edge bug in
torch_native_linear, which no smoke case reaches, is found within a small budget on CPU and shrunk to the
one request the bug needs."""
import json
import shlex

from hypothesis import HealthCheck, given, seed, settings

from kit.__main__ import main as kit_main
from kit.engine.case import Case
from kit.engine.case_line import format_case, parse_case
from kit.engine.draws import SIZES, Takes
from kit.engine.features import RECURRENT
from kit.engine.kinds.recurrent import CHUNK, DTYPES, KINDS, MODES, RecurrentCase
from kit.engine.profile import SGLANG
from kit.fuzz.search import Target, first_failure, shrink
from kit.fuzz.strategies import any_case
from kit.modes import Exec, ForwardMode

PLANTED = "tests.toys.planted:SecondChunkFromSavedState"
RECURRENT_KINDS = frozenset(KINDS)
# The cases the planted bug must be found within (the seed makes the search the same everywhere).
SEARCH_EXAMPLES = 20


def _draw(n: int, kinds=RECURRENT_KINDS, modes=MODES):
    drawn = []

    @seed(0)
    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(any_case(modes, "small", Takes(SGLANG, kinds=kinds)))
    def collect(case):
        drawn.append(case)

    collect()
    return drawn


def test_drawn_recurrent_cases_cover_modes_kinds_states_edges_and_accepted_lengths():
    drawn = _draw(300)
    assert all(isinstance(c, RecurrentCase) and parse_case(format_case(c)) == c for c in drawn)
    seen = lambda f: {f(c) for c in drawn}  # noqa: E731
    assert seen(lambda c: c.mode) == set(MODES) and seen(lambda c: c.kind) == set(KINDS)
    assert seen(lambda c: c.dtype) == set(DTYPES)
    lens = {n for c in drawn if c.mode in (ForwardMode.EXTEND, ForwardMode.MIXED) for n in c.new_lens}
    conv_edge = RecurrentCase.conv_width - 1
    assert {conv_edge - 1, conv_edge, conv_edge + 1, CHUNK - 1, CHUNK, CHUNK + 1} <= lens, sorted(lens)
    verifies = [c for c in drawn if c.mode is ForwardMode.TARGET_VERIFY]
    assert any(len(set(c.accepted)) > 1 for c in verifies) and any(min(c.accepted) == c.new for c in verifies)
    assert SIZES["small"].max_bs in seen(lambda c: c.bs) and SGLANG.batch_sizes[3] in seen(lambda c: c.bs)
    assert any(c.heads[1] > c.heads[0] for c in drawn if c.kind != "kda") and \
        all(c.heads[1] == c.heads[0] for c in drawn if c.kind == "kda")  # Kimi Linear's heads alike


def test_drawn_recurrent_cases_reach_every_value_of_every_recurrent_feature():
    drawn = _draw(300)
    missing = [(f.name, value) for f in RECURRENT for value in f.values if not any(f.of(c) == value for c in drawn)]
    assert not missing, missing


def test_the_backend_s_kinds_decide_what_is_drawn():
    """A backend of one recurrent kind gets that kind's cases; one of the softmax kinds none of them."""
    assert {c.kind for c in _draw(40, frozenset({"mamba2"}))} == {"mamba2"}
    assert all(isinstance(c, Case) for c in _draw(40, frozenset({"dense"}), (ForwardMode.DECODE,)))


def test_a_recurrent_failure_shrinks_to_fewer_requests_and_shorter_lengths():
    target = Target(PLANTED, (ForwardMode.EXTEND,), (Exec.EAGER,), device="cpu")
    busy = RecurrentCase("gdn_bs3_chunk", ForwardMode.EXTEND, prefix=(9, 30, 4), new=(5, CHUNK + 1, 12),
                         heads=(1, 2), head_k_dim=16, head_v_dim=32, dtype="fp32")
    found = first_failure(target, busy, Exec.EAGER)
    small = shrink(target, found)
    assert found.failure_class == small.failure_class
    assert small.case.bs == 1 and small.case.new == (CHUNK + 1,) and small.case.prefix[0] < 30, small.line


def test_fuzzer_finds_a_chunk_edge_bug_and_shrinks_it_to_one_request(capsys, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    code = kit_main(["fuzz", "--backend", PLANTED, "--seed", "1", "--database", "none", "--device", "cpu",
                     "--ledger", str(ledger), "--max-examples", str(SEARCH_EXAMPLES), "--budget", "600",
                     "--shrink-budget", "600"])
    out = capsys.readouterr().out
    assert code == 1, out
    [record] = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert record["first_example"] <= SEARCH_EXAMPLES and record["shrunk"], record
    [failure] = record["new"]
    assert failure["known"] is None and "cases/linear.py" in out, out
    case = parse_case(failure["case_line"])
    # No larger than the bug needs: one new request, one token past the chunk, the smallest heads.
    assert isinstance(case, RecurrentCase) and case.mode in (ForwardMode.EXTEND, ForwardMode.MIXED), failure
    assert case.bs == (1 if case.mode is ForwardMode.EXTEND else 2) and case.new_lens[0] == CHUNK + 1, failure
    assert case.heads == (1, 1) and case.dtype == "fp32", failure
    repro = shlex.split(failure["repro"])
    assert repro[repro.index("--case-line") + 1] == failure["case_line"]
    assert kit_main(repro[3:] + ["--device", "cpu", "--timeout", "0"]) == 1
    assert "fail [" in capsys.readouterr().out
