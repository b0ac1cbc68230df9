"""How the matrix is laid out: one backend at a time (a backend's stray write into the kit's memory
must not reach the batch another backend is judged on), a case's eager and graph runs together."""
import os
import types
import subprocess
import sys

from kit.pytest_plugin import threads_per_worker
from kit.record import parse_run_id
from kit.results import REPO


def test_backends_are_not_interleaved_and_a_cases_runs_follow_each_other():
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "--co", "-q",
                           "-p", "no:cacheprovider", "--backend", "torch_native", "--backend", "triton",
                           "--case-set", "smoke", "--mode", "decode"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [parse_run_id(line.split("[", 1)[1].rsplit("]", 1)[0]) for line in proc.stdout.splitlines()
            if "::test_conformance[" in line]
    backends = [b for b, *_ in runs]
    assert [b for i, b in enumerate(backends) if i == 0 or backends[i - 1] != b] == ["torch_native", "triton"]
    for i in range(0, len(runs), 2):
        (b1, m1, e1, c1), (b2, m2, e2, c2) = runs[i], runs[i + 1]
        assert (b1, m1, c1, e1, e2) == (b2, m2, c2, "eager", "graph")


def test_xdist_workers_split_the_cores(tmp_path):
    """Each of N workers runs torch with its share of the threads, not one per core each
    (oversubscribed, they slowed the GPU matrix by 1.7x)."""
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 capture_output=True, text=True, check=True).stdout)
    (tmp_path / "test_threads.py").write_text(
        "import torch\n\ndef test_threads():\n"
        f"    assert torch.get_num_threads() == {threads_per_worker(default, 2)}\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_threads.py")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


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


def _scheduled(scheduler_cls, groups, workers, **kwargs):
    """Runs per group {group: count}, scheduled on `workers` fake workers, each finishing its runs
    in the order sent, the workers in turn: the backends each worker ran, in order."""
    sched = scheduler_cls(_Config(workers), **kwargs)
    collection = [f"tests/test_conformance.py::test_conformance[{g}-{i}]@{g}" for g, n in groups.items()
                  for i in range(n)]
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    done = {node: 0 for node in nodes}
    while any(done[n] < len(n.sent) for n in nodes):
        for node in nodes:
            if done[node] < len(node.sent):
                sched.mark_test_complete(node, node.sent[done[node]])
                done[node] += 1
    ran = {node.name: [] for node in nodes}
    for node in nodes:
        for i in node.sent:
            backend = collection[i].rsplit("@", 1)[1].split("-", 1)[0]
            if not ran[node.name] or ran[node.name][-1] != backend:
                ran[node.name].append(backend)
    assert sum(len(n.sent) for n in nodes) == len(collection)
    return ran


def test_xdist_workers_keep_to_one_backend():
    """Under --dist loadgroup each worker runs one backend's groups while it has any: its first run
    of a backend loads it (seconds each). Three backends, 8 groups of 10 runs each, 6 workers: every
    worker starts on its own backend, two per backend, and none goes back to one it left."""
    from xdist.scheduler import LoadGroupScheduling

    from kit.worker_affinity import BackendAffinityScheduling
    groups = {f"{b}-decode-v{i}": 10 for b in ("flashinfer", "triton", "torch_native") for i in range(8)}
    ran = _scheduled(BackendAffinityScheduling, groups, 6, labels=["flashinfer", "triton", "torch_native"])
    assert sorted(r[0] for r in ran.values()) == sorted(["flashinfer", "triton", "torch_native"] * 2), ran
    assert all(len(r) == len(set(r)) for r in ran.values()) and sum(len(r) for r in ran.values()) <= 8, ran
    plain = _scheduled(LoadGroupScheduling, groups, 6)  # xdist's order: the check above can fail
    assert sum(len(r) for r in plain.values()) > 8, plain
