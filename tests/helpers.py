"""Shared helpers of the kit's own tests: one case builder, fixtures and runs set up by the
runner's own code (kit.harness.runner.RunSetup), and processes run once per test session."""
import fcntl
import json
import os
import shutil
import subprocess

from backends import pinned
from backends.torch_native import TorchNativeBackend
from kit.engine.case import Case
from kit.modes import Exec
from kit.harness.capabilities import Capabilities
from kit.harness.runner import RunSetup
from kit.report.results import REPO


def small_case(name, mode, prefix, new=1, *, heads=(4, 2), head_dim=16, dtype="fp32", **kw) -> Case:
    """A small fp32 case (fast on CPU, exact enough to judge tightly)."""
    return Case(name=name, mode=mode, prefix=prefix, new=new, heads=heads, head_dim=head_dim, dtype=dtype, **kw)


def run_setup(case, exec_=Exec.EAGER, device="cpu", backend_cls=None) -> RunSetup:
    """Fixtures, pool and layer of one run, exactly as the runner builds them (for the backend's
    engine profile: the in-box torch_native's where there is no backend)."""
    caps = Capabilities.of(backend_cls or TorchNativeBackend)
    return RunSetup.make(backend_cls, caps, case, exec_, device)


def make_fixture(case, device="cpu"):
    """The case's installed fixture, built as the runner builds them (its batch in an eager run)."""
    fx = run_setup(case, device=device).case_fixture
    fx.install()
    return fx


def count_calls(monkeypatch, owner, name: str) -> list:
    """`owner.name` still called, each call appended to the list returned."""
    calls, real = [], getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)
    return calls


def uncached_versions(monkeypatch) -> None:
    """The engines' pin checks read importlib.metadata.version at each call, for a test that
    patches it (the process keeps the versions it read first)."""
    monkeypatch.setattr(pinned, "installed_version", pinned.installed_version.__wrapped__)


def once_per_session(tmp_path_factory, name: str, make):
    """`make(folder)` -> (a subprocess.CompletedProcess, JSON-able data), run once per test session
    in a folder of its own: under xdist the first worker to ask runs it, the others wait for it and
    read what it left (pytest-xdist's recipe for session fixtures), so tests that read one process
    cost one process wherever the scheduler puts them. Returns (process, data, folder)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, under xdist
    folder, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            folder.mkdir(exist_ok=True)
            proc, data = make(folder)
            done.write_text(json.dumps(dict(args=proc.args, returncode=proc.returncode, stdout=proc.stdout,
                                            stderr=proc.stderr, data=data)))
    saved = json.loads(done.read_text())
    return (subprocess.CompletedProcess(saved["args"], saved["returncode"], saved["stdout"], saved["stderr"]),
            saved["data"], folder)


def copy_of_the_kit(root, names) -> None:
    """The repository's `names` (folders and files) copied under `root`, caches left out: a copy
    a test may add files to."""
    for name in names:
        source = REPO / name
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, root / name)
