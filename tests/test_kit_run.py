"""A run names itself once (kit.harness.run.Run: id, repro, record skeleton), and the session's
runs are one product (kit.plugin.selection.Selection.product) in the order the batches are shared by."""
import itertools
import shlex

from kit.engine.catalog import load_catalog
from kit.harness.run import Run
from kit.modes import EXECS, MODES, Exec, ForwardMode
from kit.plugin.selection import Selection
from kit.report.record import PASS, parse_run_id
from tests.helpers import small_case

CASE = small_case("tiny", ForwardMode.DECODE, prefix=(3, 5))


def test_a_runs_record_repro_and_id_name_the_same_run():
    run = Run("tests.toys.dense:DenseGraphBackend", "toy_dense", CASE, Exec.GRAPH, catalog="my.cases:CATALOG")
    r = run.record(outcome=PASS)
    assert (r.backend, r.mode, r.exec, r.case, r.dtype) == ("toy_dense", "decode", "graph", "tiny", CASE.dtype)
    assert r.test_id == run.id and parse_run_id(run.id) == ("toy_dense", "decode", "graph", "tiny")
    args = shlex.split(r.repro)
    assert args[args.index("--backend") + 1] == run.spec  # the spec it loads by, not its label
    assert args[args.index("--cases") + 1] == "my.cases:CATALOG" and "--timeout" not in args
    assert shlex.split(run.record(12.5, outcome=PASS).repro)[-2:] == ["--timeout", "12.5"]


def _selection(ci_cases=None, execs=EXECS):
    catalog = load_catalog()
    labels = {"torch_native": "torch_native", "tests.toys.dense:DenseGraphBackend": "toy_dense"}
    return Selection(labels=labels, modes=list(MODES), execs=list(execs), catalog_target=None, known=[],
                     _load=lambda: (catalog, "smoke", dict.fromkeys(labels, None) | (ci_cases or {})))


def test_the_product_keeps_backends_apart_and_a_cases_execs_together():
    runs = list(_selection().product())
    ids = [run.id for run in runs]
    assert len(ids) == len(set(ids)) == 2 * len(EXECS) * sum(len(load_catalog().matrix_cases("smoke", m)) for m in MODES)
    backends = [label for label, _ in itertools.groupby(run.label for run in runs)]
    assert backends == ["torch_native", "toy_dense"]  # each backend's runs in one stretch
    cases = [key for key, _ in itertools.groupby((run.label, run.case.mode, run.case.name) for run in runs)]
    assert len(cases) == len(runs) // len(EXECS)  # a case's execs one after another


def test_ci_cases_narrow_the_session_and_its_catalog():
    """The default CPU run gives a backend its ci_cases alone, and its results file is that run
    whole: the catalog holds the backend's ci_cases in every mode and exec, not its other cases."""
    first = load_catalog().cases("smoke", ForwardMode.DECODE)[0].name
    sel = _selection(ci_cases={"torch_native": {"decode": [first]}}, execs=[Exec.EAGER])
    native = [run.id for run in sel.product() if run.label == "torch_native"]
    assert native == [f"torch_native-decode-eager-{first}"]
    catalog = set(sel.catalog_ids())
    assert set(native) < catalog
    assert {rid for rid in catalog if rid.startswith("torch_native-")} == {
        f"torch_native-decode-{e}-{first}" for e in ("eager", "graph")}
    assert {run.id for run in _selection(execs=[Exec.EAGER]).product()} - catalog  # the other cases: not in it


def test_a_run_named_by_its_id_loads_by_its_spec():
    sel = _selection()
    run = next(r for r in sel.product() if r.label == "toy_dense")
    again = sel.run_named(run.id)
    assert again == run and again.spec == "tests.toys.dense:DenseGraphBackend"
