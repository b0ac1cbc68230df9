"""First use from a clean clone: the plugin's options are always known, and the install
instructions put the CPU build of torch first."""
import importlib.metadata
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_plugin_is_registered_as_a_pytest11_entry_point():
    """Not a conftest: registered twice it would error, and a conftest under tests/ is not loaded
    when the command line names no test path (below)."""
    plugins = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert "kit.plugin.pytest_plugin" in plugins
    assert not (REPO / "tests" / "conftest.py").exists()


def test_readme_command_runs_twice(tmp_path):
    """With the results file already there, pytest must still take it as --results-json's value
    (before the entry point, the existing file was read as a test path and the option was unknown).
    The conformance file alone is collected: the arguments are read the same, and the other test
    files' imports (SGLang's, vLLM's) would only add seconds."""
    existing = tmp_path / "results-local.json"
    existing.write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                           "--results-json", str(existing), "tests/test_conformance.py"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tests/test_conformance.py::test_conformance[" in proc.stdout


CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def _section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_installs_cpu_torch_first_from_the_cpu_index():
    """In the install code block the CPU torch line, from PyTorch's CPU index, comes before
    `pip install -e .` (the other order resolves the CUDA build and its NVIDIA packages)."""
    install = _section("Install")
    by_hand = next(b for b in (part.split("```", 1)[0] for part in install.split("```bash\n")[1:])
                   if "pip install torch==" in b)
    block = by_hand.splitlines()
    torch_line = next(i for i, line in enumerate(block) if line.startswith("pip install torch=="))
    kit_line = next(i for i, line in enumerate(block) if line.startswith("pip install -e ."))
    assert torch_line < kit_line and CPU_INDEX in block[torch_line]
    assert install.index("CPU build of PyTorch") < install.index(by_hand)


def test_readme_sets_up_in_one_step_per_kind_of_machine():
    install = _section("Install")
    first = install.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "python scripts/setup.py cpu" in first and "python scripts/setup.py cuda" in first


def test_ci_sets_up_in_one_step_and_says_where_cpu_torch_comes_from():
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    setup_line = next(i for i, line in enumerate(lines) if line.startswith("python scripts/setup.py cpu"))
    assert not any("pip install" in line and "-e" in line for line in lines if not line.startswith("#"))
    comments = [line for line in lines[:setup_line] if line.startswith("#")]
    assert any("TORCH_INDEX_URL" in line for line in comments)
    assert any("https://download.pytorch.org/whl/cpu" in line for line in comments)
    assert any(line.startswith("export CI=true") for line in lines[setup_line:])
    workflow = (REPO / ".github" / "workflows" / "conformance.yml").read_text()
    assert 'TORCH_INDEX_URL: "https://download.pytorch.org/whl/cpu"' in workflow and "results-cpu.html" in workflow
