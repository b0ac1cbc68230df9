"""How the matrix is laid out: one backend at a time (a backend's stray write into the kit's memory
must not reach the batch another backend is judged on), a case's eager and graph runs together."""
import json
import os
import types
import subprocess
import sys

import pytest

from tests import SUBPROCESS_TIMEOUT_S
from kit.process.placement import threads_per_worker
from kit.report.record import parse_run_id
from kit.report.results import REPO
from tests.helpers import once_per_session


def test_backends_are_not_interleaved_and_a_cases_runs_follow_each_other():
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "--co", "-q",
                           "-p", "no:cacheprovider", "--backend", "torch_native", "--backend", "triton",
                           "--case-set", "smoke", "--mode", "decode"], cwd=REPO, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [parse_run_id(line.split("[", 1)[1].rsplit("]", 1)[0]) for line in proc.stdout.splitlines()
            if "::test_conformance[" in line]
    backends = [b for b, *_ in runs]
    assert [b for i, b in enumerate(backends) if i == 0 or backends[i - 1] != b] == ["torch_native", "triton"]
    for i in range(0, len(runs), 2):
        (b1, m1, e1, c1), (b2, m2, e2, c2) = runs[i], runs[i + 1]
        assert (b1, m1, c1, e1, e2) == (b2, m2, c2, "eager", "graph")


@pytest.fixture
def xdist_session(tmp_path_factory):
    return once_per_session(tmp_path_factory, "xdist_session", _xdist_session)


def _xdist_session(tmp):
    """One `-n 2 --dist load` session of the three test files below (each test looks at its own
    file's effects): the process (and no data). Four tests: xdist's load scheduling sends each
    worker two in a row, so test_two.py's two tests run on different workers."""
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 capture_output=True, text=True, check=True).stdout)
    (tmp / "test_threads.py").write_text(
        "import torch\n\ndef test_threads():\n"
        f"    assert torch.get_num_threads() == {threads_per_worker(default, 2)}\n")
    (tmp / "test_end.py").write_text(
        "import atexit, pathlib\n\n"
        "class _Freed:\n    def __init__(self):\n        self.open, self.path = open, str(pathlib.Path('freed').resolve())\n\n"
        "    def __del__(self):\n        self.open(self.path, 'w').close()\n\n"
        "KEPT = _Freed()\natexit.register(pathlib.Path('atexit').write_text, '')\n\n"
        "def test_end():\n    pass\n")
    (tmp / "test_two.py").write_text(
        "import atexit, os, pathlib, time\n\n"
        "def _mark(name):\n    pathlib.Path(name + '.' + os.environ['PYTEST_XDIST_WORKER']).write_text(repr(time.time()))\n\n"
        "def test_fast():\n    atexit.register(_mark, 'fast-exit')\n\n"
        # the slow test waits for the fast worker's exit (however loaded the machine), up to a minute
        "def test_slow():\n    deadline = time.time() + 60\n"
        "    while not list(pathlib.Path().glob('fast-exit.*')) and time.time() < deadline:\n        time.sleep(0.1)\n"
        "    _mark('slow-end')\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "load", "-q", "-p", "no:cacheprovider",
                           "-rA", "test_threads.py", "test_two.py", "test_end.py"], cwd=tmp, capture_output=True,
                          text=True, timeout=SUBPROCESS_TIMEOUT_S, env=env)
    return proc, None


def test_xdist_workers_split_the_cores(xdist_session):
    """Each of N workers runs torch with its share of the threads, not one per core each
    (oversubscribed, they slowed the GPU matrix by 1.7x)."""
    proc = xdist_session[0]
    assert "PASSED test_threads.py::test_threads" in proc.stdout, proc.stdout + proc.stderr


class _Worker:
    """What xdist's scheduler asks of a worker: the runs sent to it, by index in the collection."""

    shutting_down = False

    def __init__(self, name):
        self.name, self.sent = name, []
        self.gateway = types.SimpleNamespace(id=name)

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


class _Config:
    option = types.SimpleNamespace(loadscopereorder=True)

    def __init__(self, workers):
        self.workers = workers

    def getvalue(self, name):
        return [f"{self.workers}*popen"] if name == "tx" else None


GROUPS = {f"{b}-decode-v{i}": (b, 10) for b in ("flashinfer", "triton", "torch_native") for i in range(8)}
# Node ids as pytest 9 has them under --dist loadgroup (no `@group` suffix): run id -> (group, backend)
RUNS = {f"tests/test_conformance.py::test_conformance[{g}-eager-case{i}]": (g, b)
        for g, (b, n) in GROUPS.items() for i in range(n)}


def _scheduled(scheduler_cls, workers, runs=RUNS, **kwargs):
    """`runs` (node id -> (group, backend)) scheduled on `workers` fake workers, each finishing its
    runs in the order sent, the workers in turn: (the backends each worker ran, in order; the
    workers each group ran on)."""
    sched = scheduler_cls(_Config(workers), **kwargs)
    collection = list(runs)
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    done = {node: 0 for node in nodes}
    progress = True
    while progress:
        progress = False
        for node in nodes:
            # An xdist worker runs a run once it has the next one (pytest's teardown needs to know
            # it) or is told to shut down; it holds its last one until then.
            if done[node] < len(node.sent) - 1 or done[node] < len(node.sent) and node.shutting_down:
                sched.mark_test_complete(node, node.sent[done[node]])
                done[node] += 1
                progress = True
    assert all(done[n] == len(n.sent) for n in nodes), f"workers wait for runs that never come: {done}"
    ran, on = {node.name: [] for node in nodes}, {}
    for node in nodes:
        for i in node.sent:
            group, backend = runs[collection[i]]
            on.setdefault(group, set()).add(node.name)
            if not ran[node.name] or ran[node.name][-1] != backend:
                ran[node.name].append(backend)
    assert sum(len(n.sent) for n in nodes) == len(collection)
    return ran, on


def test_xdist_workers_keep_to_one_backend():
    """Under --dist loadgroup a group's runs go to one worker, and each worker runs one backend's
    groups while it has any: its first run of a backend loads it (seconds each). Three backends, 8
    groups of 10 runs each, 6 workers: every worker starts on its own backend, two per backend,
    and none goes back to one it left."""
    from xdist.scheduler import LoadGroupScheduling

    from kit.plugin.worker_affinity import BackendAffinityScheduling
    ran, on = _scheduled(BackendAffinityScheduling, 6, group_of=RUNS.get)
    assert sorted(r[0] for r in ran.values()) == sorted(["flashinfer", "triton", "torch_native"] * 2), ran
    assert all(len(r) == len(set(r)) for r in ran.values()) and sum(len(r) for r in ran.values()) <= 8, ran
    assert all(len(workers) == 1 for workers in on.values()), on
    # xdist's own scheduler on pytest 9's node ids: every run a group of its own, every worker every backend
    ran, on = _scheduled(LoadGroupScheduling, 6)
    assert sum(len(r) for r in ran.values()) > 8 and any(len(workers) > 1 for workers in on.values()), (ran, on)


def test_runs_start_as_soon_as_the_first_worker_has_collected():
    """xdist's loadgroup starts no run before every worker has collected; here the first worker to
    collect starts, a later one joins when its collection arrives, and a late collection that
    differs fails the session's collection (the worker gets nothing)."""
    from kit.plugin.worker_affinity import BackendAffinityScheduling
    config = _Config(3)
    reports = []
    config.hook = types.SimpleNamespace(pytest_collectreport=lambda report: reports.append(report))
    sched = BackendAffinityScheduling(config, group_of=RUNS.get)
    first, second, odd = (_Worker(f"gw{i}") for i in range(3))
    for node in (first, second, odd):
        sched.add_node(node)
    collection = list(RUNS)
    sched.add_node_collection(first, collection)
    assert sched.collection_is_completed
    sched.schedule()
    assert first.sent and not second.sent
    sched.add_node_collection(second, collection)
    sched.schedule()
    assert second.sent and not set(first.sent) & set(second.sent)
    sched.add_node_collection(odd, collection[1:])
    sched.schedule()
    assert not odd.sent and [r.nodeid for r in reports if r.failed] == ["gw2"], reports


def _runs(groups):
    """Node ids -> (group, backend) for {group: (backend, number of runs)}."""
    return {f"tests/test_conformance.py::test_conformance[{g}-eager-case{i}]": (g, b)
            for g, (b, n) in groups.items() for i in range(n)}


@pytest.mark.parametrize("last_group_runs, moves", [(2, False), (20, True)])
def test_a_worker_moves_to_another_backend_only_for_more_runs_than_a_load_costs(last_group_runs, moves):
    """Two workers: one on the big `slow` group, the other on `fast`'s only group. When `fast` is
    done, its worker takes slow's last group only if that group outlasts a backend load
    (kit.plugin.worker_affinity.LOAD_RUNS) on the worker that has slow loaded; else it ends."""
    from kit.plugin.worker_affinity import LOAD_RUNS, BackendAffinityScheduling
    assert 2 < LOAD_RUNS < 20
    runs = _runs({"slow-1": ("slow", 30), "slow-2": ("slow", last_group_runs), "fast-1": ("fast", 12)})
    ran, on = _scheduled(BackendAffinityScheduling, 2, runs, group_of=runs.get)
    assert sorted(ran.values()) == sorted([["slow"], ["fast", "slow"] if moves else ["fast"]]), ran


def test_a_worker_that_ends_hands_what_is_left_to_the_workers_that_have_its_backend():
    """Three backends of two one-run groups, two workers, the second collecting late: a worker that
    ends rather than load a backend another worker has hands that backend's last groups to that
    worker, which holds its last run until it has another or is told to end (xdist's workers do:
    the matrix hung there on a 2-core machine)."""
    from kit.plugin.worker_affinity import BackendAffinityScheduling
    runs = _runs({f"{b}-{i}": (b, 1) for b in ("a", "b", "c") for i in range(2)})
    collection = list(runs)
    sched = BackendAffinityScheduling(_Config(2), group_of=runs.get)
    first, late = _Worker("gw0"), _Worker("gw1")
    for node in (first, late):
        sched.add_node(node)
    sched.add_node_collection(first, collection)
    sched.schedule()
    sched.add_node_collection(late, collection)
    sched.schedule()
    done = {first: 0, late: 0}
    progress = True
    while progress:
        progress = False
        for node in (first, late):
            if done[node] < len(node.sent) - 1 or done[node] < len(node.sent) and node.shutting_down:
                sched.mark_test_complete(node, node.sent[done[node]], 1.0)
                done[node] += 1
                progress = True
    assert done == {first: len(first.sent), late: len(late.sent)} and sum(done.values()) == len(runs), (
        f"workers wait for runs that never come: {first.sent}, {late.sent}, done {done}")


def test_a_backends_last_groups_go_to_whichever_of_its_workers_is_free_first():
    """Two workers on `y` (six groups of 3 runs), one on `x` (4 runs), all as fast: when x is done,
    y's queued runs are too few to be worth a load, so x's worker ends; y's last groups then go
    one at a time to y's workers as they free up (9 runs each), not all to one of them (6 and 12:
    on the H100 one worker ran the last groups after the rest had ended)."""
    from kit.plugin.worker_affinity import BackendAffinityScheduling
    groups = {"x-1": ("x", 4), **{f"y-{i}": ("y", 3) for i in range(6)}}
    runs = _runs(groups)
    ran, on = _scheduled(BackendAffinityScheduling, 3, runs, group_of=runs.get)
    assert sorted(ran.values()) == [["x"], ["y"], ["y"]], ran
    per_worker = {}
    for group, workers in on.items():
        for worker in workers:
            per_worker[worker] = per_worker.get(worker, 0) + groups[group][1]
    assert sorted(per_worker.values()) == [4, 9, 9], per_worker


@pytest.mark.parametrize("timed", [False, True])
def test_a_free_worker_goes_where_the_pending_work_takes_longest(timed):
    """Workers on `slow` (1 s a run) and `quick` (0.1 s), each 5 runs into its first group; a third
    collects then. By run counts quick has more pending per worker (20 runs against 10), by the
    time its runs took slow has (10 s against 2 s): the third goes to slow, and to quick when
    the runs say nothing of their time."""
    from kit.plugin.worker_affinity import BackendAffinityScheduling
    runs = _runs({"slow-1": ("slow", 10), "slow-2": ("slow", 10), "quick-1": ("quick", 10),
                  "quick-2": ("quick", 10), "quick-3": ("quick", 10)})
    sched = BackendAffinityScheduling(_Config(3), group_of=runs.get)
    first, second, third = (_Worker(f"gw{i}") for i in range(3))
    collection = list(runs)
    for node in (first, second, third):
        sched.add_node(node)
    for node in (first, second):
        sched.add_node_collection(node, collection)
    sched.schedule()
    seconds = {"slow": 1.0, "quick": 0.1}
    for node in (first, second):
        for i in node.sent[:5]:
            sched.mark_test_complete(node, i, seconds[runs[collection[i]][1]] if timed else 0)
    assert {runs[collection[n.sent[0]]][1] for n in (first, second)} == {"slow", "quick"}
    sched.add_node_collection(third, collection)
    sched.schedule()
    assert runs[collection[third.sent[0]]][1] == ("slow" if timed else "quick")


@pytest.fixture
def matrix_session(tmp_path_factory):
    return once_per_session(tmp_path_factory, "matrix_session", _matrix_session)


def _matrix_session(tmp):
    """One session as the matrix command runs (`-n 2 --dist loadgroup`), of two backends' smoke
    decode runs, with the run timeline (benchmarks.timeline) and the spawn probe
    (tests.toys.spawn_probe) as plugins: the process (and no data)."""
    (tmp / "timeline").mkdir()
    env = {**os.environ, "KIT_TIMELINE_DIR": str(tmp / "timeline"), "KIT_SPAWN_PROBE": str(tmp / "probe.json")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p",
                           "no:cacheprovider", "-p", "benchmarks.timeline", "-p", "tests.toys.spawn_probe",
                           "tests/test_conformance.py", "--backend", "torch_native", "--backend",
                           "tests.toys.dense:DenseGraphBackend", "--case-set", "smoke", "--mode", "decode"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)
    return proc, None


def test_the_matrix_command_groups_runs_by_backend(matrix_session):
    """End to end (`-n 2 --dist loadgroup`, two backends, benchmarks.timeline): the two workers
    start on different backends. With xdist_group marks alone, pytest 9 dropped the groups and
    both started on the first backend in the queue."""
    proc, _, folder = matrix_session
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = []
    for path in sorted((folder / "timeline").glob("gw*.jsonl")):
        tests = [json.loads(line) for line in path.read_text().splitlines() if '"test"' in line]
        first.append(parse_run_id(min(tests, key=lambda e: e["t"])["id"])[0])
    assert sorted(first) == ["torch_native", "toy_dense"], first


def test_the_xdist_controller_starts_its_workers_before_importing_torch(matrix_session):
    """The controller runs no case: importing the plugin (and a case) must not import torch, and
    the catalog (whose cases import it, via their modes' rules) loads once the workers are started.
    Before, the controller spent 4-5 s of every matrix run on an H100 machine importing torch before
    it started a worker."""
    probe = subprocess.run([sys.executable, "-c", "import sys, kit.plugin.pytest_plugin, kit.engine.case, kit.report.results\n"
                            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"],
                           cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr
    proc, _, folder = matrix_session
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((folder / "probe.json").read_text()) == {"catalog_loaded": False}


def test_an_xdist_worker_skips_the_interpreters_teardown(xdist_session):
    """After its session a worker runs its exit handlers, then exits: an object freed only by the
    interpreter's teardown is never freed, an atexit handler still runs."""
    proc, _, folder = xdist_session
    assert "PASSED test_end.py::test_end" in proc.stdout, proc.stdout + proc.stderr
    assert (folder / "atexit").exists() and not (folder / "freed").exists()


def test_an_xdist_worker_ends_when_its_own_session_does(xdist_session):
    """A worker whose runs are done exits then, not when the controller ends every worker after the
    last run anywhere: the fast worker's exit handler runs while the other worker's test still runs."""
    proc, _, folder = xdist_session
    assert "PASSED test_two.py::test_fast" in proc.stdout and "PASSED test_two.py::test_slow" in proc.stdout, \
        proc.stdout + proc.stderr
    (fast,), (slow,) = folder.glob("fast-exit.*"), folder.glob("slow-end.*")
    assert fast.suffix != slow.suffix, "both tests ran on one worker"
    assert float(fast.read_text()) < float(slow.read_text())


def test_workers_are_started_together():
    """kit.plugin.parallel_spawn: xdist's NodeManager starts its workers from threads (each start here
    waits for the other three: one after another, the first would wait in vain), whatever the load."""
    import threading

    from xdist.workermanage import NodeManager

    from kit.plugin import parallel_spawn
    parallel_spawn.install()
    started = []

    class _Nodes(NodeManager):
        def __init__(self):
            self.specs, self.trace = ["gw0", "gw1", "gw2", "gw3"], lambda *args: None
            self.config = types.SimpleNamespace(hook=types.SimpleNamespace(pytest_xdist_setupnodes=lambda **_: None))

        def setup_node(self, spec, putevent):
            started.append(threading.get_ident())
            together.wait()  # all four at once, or, one after another, the first waits in vain
            return spec

    together = threading.Barrier(4, timeout=60)
    assert _Nodes().setup_nodes(putevent=None) == ["gw0", "gw1", "gw2", "gw3"]
    assert len(set(started)) == 4


def test_a_worker_begins_its_cuda_context_through_the_driver(monkeypatch):
    """kit.plugin.cuda_context: the device's primary context, retained through libcuda (no torch); without
    a driver, nothing."""
    import ctypes

    from kit.plugin import cuda_context
    calls = []

    class _Driver:
        def __getattr__(self, name):
            return lambda *args: calls.append(name) or 0

    monkeypatch.setattr(ctypes, "CDLL", lambda name: _Driver() if name == "libcuda.so.1" else None)
    cuda_context.begin().join()
    assert calls == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"]

    def _missing(name):
        raise OSError(name)
    monkeypatch.setattr(ctypes, "CDLL", _missing)
    cuda_context._retain_primary_context()  # no driver: returns, raises nothing
    assert len(calls) == 3


def test_a_dead_workers_run_is_its_crash_and_the_rest_goes_to_the_others():
    """xdist's loadgroup put a dead worker's whole workload back in the queue: its finished groups
    went out again as empty work that never completes (the session hung), and the run that took
    it down ran again on the next worker (which it took down too)."""
    from kit.plugin.worker_affinity import BackendAffinityScheduling
    runs = {f"tests/test_conformance.py::test_conformance[{g}-eager-case{i}]": (g, "triton")
            for g in ("triton-decode-v0", "triton-decode-v1", "triton-decode-v2", "triton-decode-v3")
            for i in range(4)}
    collection = list(runs)
    sched = BackendAffinityScheduling(_Config(2), group_of=runs.get)
    sched.config.pluginmanager = types.SimpleNamespace(getplugin=lambda name: None)
    a, b = _Worker("gw0"), _Worker("gw1")
    for node in (a, b):
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    first = list(a.sent)
    for i in first[:len(first) - 3]:  # a finishes all but the last three of its runs, then dies
        sched.mark_test_complete(a, i)
    crashed = sched.remove_node(a)
    assert crashed == collection[first[-3]]
    done = []
    while [i for i in b.sent if i not in done]:  # b runs what it is sent, in order
        done.append(next(i for i in b.sent if i not in done))
        sched.mark_test_complete(b, done[-1])
    ran = first[:len(first) - 3] + b.sent
    assert sorted(ran) == sorted(set(range(len(collection))) - {first[-3]}), "each other run exactly once"
    assert b.shutting_down and sched.remove_node(b) is None
