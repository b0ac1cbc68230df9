"""docs/extending.md names the files a new backend, attention kind and engine touch: a copy of the
kit given a toy of each, written into exactly the files the docs list (each file's change counted
against the copy as it was), runs it. The mode's list has its own test (tests/test_kit_modes.py)."""
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kit.report.results import REPO
from tests.helpers import copy_of_the_kit

COPIED = ("kit", "cases", "backends", "matrix", "tests/__init__.py", "tests/toys", "pyproject.toml")
ENTRY_POINTS = '[project.entry-points."attention_conformance.backends"]\n'

TOY_BACKEND = '''"""A toy in-box backend: the reference backend under a name of its own."""
from backends.torch_native import TorchNativeBackend


class ToyBackend(TorchNativeBackend):
    name = "toy_backend"
'''

TOY_KIND = '''"""A toy attention kind: dense attention, named by a parameter of its own."""
NAME = "toy"
LABEL = "toy attention"
FIELDS = ("toy_marker",)
PARAMETERS = (("toy_marker", False),)


def VALUES(case):
    return None if isinstance(case.toy_marker, bool) else f"toy_marker {case.toy_marker!r} must be True or False"


def APPLIES(case):
    return case.toy_marker


def PROBLEM(case):
    return None


def GEOMETRY(case):
    from kit.engine.kinds import Geometry
    return Geometry(heads=case.num_kv_heads, k_width=case.head_dim, v_width=case.head_dim, v_in_k=False)


def VARIANT_TAG(case):
    return "toy"


def FUZZ(draw, d):
    return {}
'''
TOY_CASE = '    S("toy_kind_gqa_p4", prefix=(3, 9), page=4, head_dim=16, dtype="fp32", toy_marker=True),\n'
# Outside the kit (not a file the kind touches): a backend that runs the toy kind, stored as dense is.
KIND_RUNNER = '''import dataclasses

from backends.torch_native import TorchNativeBackend
from kit.engine.profile import NATIVE


class ToyKindBackend(TorchNativeBackend):
    name = "toy_kind_native"
    attention_kinds = TorchNativeBackend.attention_kinds + ("toy",)
    profile = dataclasses.replace(NATIVE, name="toy-native", storage=dict(NATIVE.storage, toy="split"))
'''


def listed(title: str) -> list:
    """The files docs/extending.md says a new one touches, in the section that adds it."""
    text = " ".join((REPO / "docs" / "extending.md").read_text().split())
    section = text.split(title, 1)[1]
    files = section.split("the files it touches: ", 1)[1].split(";", 1)[0]
    return re.findall(r"`([^`]+)`", files)


def _digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture()
def copy(tmp_path):
    copy_of_the_kit(tmp_path, COPIED)
    return tmp_path


def _written(root: Path, write) -> set:
    """The files of `root` that `write(root)` adds or changes."""
    before = _digests(root)
    write(root)
    after = _digests(root)
    return {path for path, digest in after.items() if before.get(path) != digest}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def _kit(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "PYTHONNOUSERSITE": "1"}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)


def _entry_point(root: Path, name: str) -> str:
    """What the copy's pyproject.toml registers as backend `name`, loaded as an installed kit would."""
    proc = _kit(root, "-c", "import importlib.metadata as m, sys, tomllib; "
                "group = tomllib.load(open('pyproject.toml', 'rb'))['project']['entry-points']"
                "['attention_conformance.backends']; "
                f"print(m.EntryPoint({name!r}, group[{name!r}], 'attention_conformance.backends').load().name)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def _passes(root: Path, backend: str, mode: str, exec_: str, case: str) -> None:
    proc = _kit(root, "-m", "kit", "run", "--backend", backend, "--mode", mode, "--exec", exec_, "--case", case)
    assert proc.returncode == 0 and "pass" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_backend_is_its_file_and_its_entry_point(copy):
    def write(root):
        (root / "backends/toy_backend.py").write_text(TOY_BACKEND)
        _edit(root / "pyproject.toml", ENTRY_POINTS, ENTRY_POINTS + 'toy_backend = "backends.toy_backend:ToyBackend"\n')

    expected = [path.replace("<backend>", "toy_backend") for path in listed("## Adding a backend")]
    assert _written(copy, write) == set(expected)
    assert _entry_point(copy, "toy_backend") == "toy_backend"
    _passes(copy, "backends.toy_backend:ToyBackend", "decode", "eager", "gqa_ragged_p16_fp32")


def test_a_kind_is_its_file_its_registration_and_its_cases(copy):
    def write(root):
        (root / "kit/engine/kinds/toy.py").write_text(TOY_KIND)
        init = root / "kit/engine/kinds/__init__.py"
        _edit(init, "from kit.engine.kinds import dense, mla, sparse_mla", "from kit.engine.kinds import dense, mla, sparse_mla, toy")
        _edit(init, "_kind(mla), _kind(dense))", "_kind(mla), _kind(toy), _kind(dense))")
        _edit(root / "cases/decode.py", "SMOKE = [\n", "SMOKE = [\n" + TOY_CASE)

    expected = [path.replace("<kind>", "toy").replace("<mode>", "decode") for path in listed("**An attention kind**")]
    assert _written(copy, write) == set(expected)
    (copy / "toy_kind_runner.py").write_text(KIND_RUNNER)
    _passes(copy, "toy_kind_runner:ToyKindBackend", "decode", "eager", "toy_kind_gqa_p4")
    # A backend that does not list the kind reads it unsupported, naming it.
    proc = _kit(copy, "-m", "kit", "run", "--backend", "torch_native", "--mode", "decode", "--exec", "eager",
                "--case", "toy_kind_gqa_p4")
    assert "toy attention" in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_an_engine_is_its_adapter_with_its_profile_and_its_entry_points(copy):
    def write(root):
        (root / "backends/toy_engine").mkdir()
        (root / "backends/toy_engine/__init__.py").write_text('"""A toy engine\'s backends."""\n')
        (root / "backends/toy_engine/adapter.py").write_text((REPO / "tests/toys/interleaved.py").read_text())
        _edit(root / "pyproject.toml", ENTRY_POINTS,
              ENTRY_POINTS + 'toy_interleaved = "backends.toy_engine.adapter:InterleavedBackend"\n')

    expected = [path.replace("<engine>", "toy_engine") for path in listed("## Adding an engine")]
    assert _written(copy, write) == set(expected)
    assert _entry_point(copy, "toy_interleaved") == "toy_interleaved"
    _passes(copy, "backends.toy_engine.adapter:InterleavedBackend", "decode", "graph", "gqa_ragged_p16_fp32")
