"""First use from a clean clone: the plugin's options are always known, and the install
instructions put the CPU build of torch first."""
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_plugin_is_registered_as_a_pytest11_entry_point():
    """Not a conftest: registered twice it would error, and a conftest under tests/ is not loaded
    when the command line names no test path (below)."""
    plugins = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert "kit.pytest_plugin" in plugins
    assert not (REPO / "tests" / "conftest.py").exists()


def test_readme_command_runs_twice(tmp_path):
    """With the results file already there, pytest must still take it as --results-json's value
    (before the entry point, the existing file was read as a test path and the option was unknown)."""
    existing = tmp_path / "results-local.json"
    existing.write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                           "--results-json", str(existing)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tests/test_conformance.py::test_conformance[" in proc.stdout
