"""How the matrix is laid out: one backend at a time (a backend's stray write into the kit's memory
must not reach the batch another backend is judged on), a case's eager and graph runs together."""
import os
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
