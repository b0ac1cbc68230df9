"""The import contracts of pyproject.toml ([tool.importlinter]: the kit's layers, the report layer
free of torch and the engine, no cycles) hold, and each one fails when a forbidden import is
planted in a copy of the tree."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit.report.results import REPO

PACKAGES = ("kit", "matrix", "cases", "backends")


def _lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the tree at `root` (its packages first on the path, no cache)."""
    return subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "PYTHONNOUSERSITE": "1"})


def test_the_layers_name_every_module_of_kit():
    """A new package or module of kit/ takes its place in the layers (else nothing says what it may import)."""
    import tomllib
    layers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    present = {p.stem if p.is_file() else p.name for p in (REPO / "kit").iterdir()
               if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem != "__init__"}
    assert present == named, f"in kit/ but not in the layers: {present - named}; named but absent: {named - present}"


def test_the_import_contracts_hold():
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout, proc.stdout


@pytest.mark.parametrize("module, planted, broken, named", [
    ("matrix/table.py", "import torch", "The report layer", "matrix.table -> torch"),
    ("kit/report/record.py", "import kit.engine.case", "The report layer", "kit.report.record -> kit.engine.case"),
    ("kit/engine/plan.py", "import kit.harness.runner", "kit: the CLI and the pytest plugin",
     "kit.engine.plan -> kit.harness.runner"),
    ("kit/engine/pools.py", "import kit.engine.fixture", "No import cycles", ".pools -> .fixture"),
])
def test_a_planted_import_breaks_its_contract(tmp_path, module, planted, broken, named):
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    assert _lint(tmp_path).returncode == 0  # the copy is analysed, and holds as the tree does
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{planted}  # planted\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    report = proc.stdout[proc.stdout.index("Broken contracts"):]
    assert broken in report, report
    assert named in report, report  # the planted import is named
