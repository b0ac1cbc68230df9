"""One-step set-up (scripts/setup.py): each step looks before it installs, so a second run installs
nothing and says so; on CPU, torch's CPU build comes first. And `python -m backends.sglang.install`
says what it installed and that it is done."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.test_matrix import REPO


@pytest.fixture
def fresh_machine(monkeypatch):
    """scripts/setup.py on a machine with nothing installed; each command it runs 'installs' its step."""
    from scripts import setup
    have = set()
    monkeypatch.setattr(setup, "_version", lambda name: "2.13.0+cpu" if "torch" in have and name == "torch" else None)
    monkeypatch.setattr(setup, "_kit_installed", lambda extras: "kit" in have and "the kit")
    monkeypatch.setattr(setup, "_engine", lambda dist, requirements: dist in have and f"{dist} pinned")
    monkeypatch.setattr(setup, "browser", lambda: "browser" in have and "chromium")
    monkeypatch.setattr(setup, "compiled", lambda names=("all",): f"{names[0]} compiled" in have and "byte-compiled")
    monkeypatch.setenv("TORCH_INDEX_URL", "https://example.org/cpu")
    ran = []

    def call(cmd, cwd=None):
        ran.append(cmd)
        text = " ".join(cmd)
        have.update(k for k, marker in (("torch", "torch=="), ("kit", "-e "), ("sglang", "backends.sglang.install"),
                                        ("vllm", "backends.vllm.install"), ("browser", "chromium-driver"))
                    if marker in text)
        if "compileall" in text:  # what is installed when it runs
            have.update(f"{name} compiled" for name in ("torch", "all") if name == "torch" or "sglang" in have)
        return 0

    monkeypatch.setattr(setup.subprocess, "call", call)
    return setup, ran


def test_second_run_installs_nothing_and_says_so(fresh_machine, capsys):
    setup, ran = fresh_machine
    assert setup.run("cpu") == 0
    first = capsys.readouterr().out
    assert "setup cpu: installed: torch" in first and "done" in first
    commands = [" ".join(c) for c in ran]
    torch_at = next(i for i, c in enumerate(commands) if "torch==2.13.0 --index-url https://example.org/cpu" in c)
    assert torch_at < next(i for i, c in enumerate(commands) if f"-e {REPO}[test]" in c)
    assert any("apt-get install -y -q --no-install-recommends chromium chromium-driver" in c for c in commands)
    sglang_at = next(i for i, c in enumerate(commands) if "backends.sglang.install" in c)
    assert sglang_at < next(i for i, c in enumerate(commands) if "backends.vllm.install" in c)  # vLLM's base first
    ran.clear()
    assert setup.run("cpu") == 0
    assert ran == [] and "setup cpu: nothing to install, all 7 steps already done" in capsys.readouterr().out


def test_it_says_what_it_installs_and_with_what_before_anything_runs(fresh_machine, capsys, monkeypatch):
    """apt-get's 440 MB browser and pip's downloads are named before the first of them runs, and pip
    shows its progress (a quiet pip said nothing for minutes)."""
    setup, ran = fresh_machine
    said_before = []
    monkeypatch.setattr(setup.subprocess, "call", lambda cmd, cwd=None: said_before.append(capsys.readouterr().out)
                        or ran.append(cmd) or 0)
    assert setup.run("cpu") == 0
    plan = said_before[0]
    assert "setup cpu: installs, in this order:" in plan
    assert "  - torch (CPU build, torch==2.13.0): pip, from https://example.org/cpu, about 200 MB" in plan
    assert "chromium, chromium-driver): apt-get" in plan and "about 440 MB" in plan, plan
    assert plan.index("torch (CPU") < plan.index("the kit with [test]") < plan.index("headless browser")
    assert all("-q" not in cmd for cmd in ran if "pip" in cmd), ran


def test_the_compile_step_compiles_every_module_and_passes_over_files_that_are_not_python(tmp_path, monkeypatch):
    from scripts import setup
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for path in (pkg / "__init__.py", pkg / "sub" / "mod.py"):
        path.write_text("X = 1\n")
    (pkg / "template.py").write_text("{% if x %}not python{% endif %}\n")
    unused = tmp_path / "sglang" / "multimodal_gen"  # a part of sglang nothing imports: left
    unused.mkdir(parents=True)
    (unused / "big.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert setup.compiled(("pkg",)) is None
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # compiled all the same
    assert subprocess.call([sys.executable, "-c", setup.COMPILE, "0", str(tmp_path)], env=env) == 0
    assert setup.compiled(("pkg",)) == "pkg byte-compiled"
    assert (pkg / "sub" / "__pycache__").is_dir()
    assert not (unused / "__pycache__").exists()
    assert {str(REPO / "kit"), str(REPO / "backends"), str(REPO / "cases")} <= set(setup.compile_dirs())


def test_torch_compiles_while_the_rest_installs_and_the_rest_compiles_after_it(fresh_machine, monkeypatch):
    setup, ran = fresh_machine
    fake = setup.subprocess.call
    kit, sglang = threading.Event(), threading.Event()  # their installs have started
    compiled, seen = [], []

    def call(cmd, cwd=None):
        text = " ".join(cmd)
        kit.set() if f"-e {REPO}" in text else None
        sglang.set() if "backends.sglang.install" in text else None
        if "compileall" in text and not seen:  # torch's: beside the installs, still running at the last
            seen.append(("beside the installs", kit.wait(10) and sglang.wait(10)))
            time.sleep(0.2)
        elif "compileall" in text:
            seen.append(("after torch's", compiled == [1]))
        code = fake(cmd, cwd)
        compiled.append(1) if "compileall" in text else None
        return code

    monkeypatch.setattr(setup.subprocess, "call", call)
    assert setup.run("cpu") == 0
    assert seen == [("beside the installs", True), ("after torch's", True)]
    assert "compileall" in " ".join(ran[-1])


def test_cuda_installs_the_kit_with_flashinfer_and_no_cpu_torch(fresh_machine):
    setup, ran = fresh_machine
    assert setup.run("cuda") == 0
    commands = [" ".join(c) for c in ran]
    assert not any("torch==" in c for c in commands) and any(f"-e {REPO}[test,flashinfer]" in c for c in commands)


def test_this_environment_needs_nothing_more():
    """After .ci/run's set-up (or a developer's), a second run has nothing left to do."""
    proc = subprocess.run([sys.executable, "scripts/setup.py", "cpu", "--dry-run"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if "nothing to install" not in proc.stdout and os.environ.get("CI") != "true":
        pytest.skip(f"this environment is not set up: {proc.stdout.strip().splitlines()[-1]}")
    assert "setup cpu: nothing to install" in proc.stdout, proc.stdout


def _fresh_install(monkeypatch, installed_after):
    """backends.pinned on a machine without the engine: pip 'installs' `installed_after`; the
    commands it ran are returned."""
    from backends import pinned
    states = iter([{"torch": "2.13.0"}, dict({"torch": "2.13.0"}, **installed_after)])
    monkeypatch.setattr(pinned, "installed", lambda: next(states))
    monkeypatch.setattr(pinned.importlib.metadata, "version", lambda name: (_ for _ in ()).throw(
        pinned.importlib.metadata.PackageNotFoundError(name)))
    ran = []
    monkeypatch.setattr(pinned.subprocess, "call", lambda cmd: ran.append(cmd) or 0)
    return ran


def test_sglang_install_says_what_it_installed_and_that_it_is_done(monkeypatch, capsys):
    from backends.sglang import install
    _fresh_install(monkeypatch, {"sglang": "0.5.23", "orjson": "3.11"})
    assert install.main() == 0
    out = capsys.readouterr().out
    assert "installed 2 packages: orjson 3.11, sglang 0.5.23" in out and "done:" in out


def test_vllm_install_installs_sglangs_base_set_with_its_own(monkeypatch, capsys):
    """vLLM's attention chain imports much of SGLang's set (pydantic, transformers, aiohttp, ...):
    one pip call with both files, --no-deps, SGLang's first."""
    from backends.vllm import install
    ran = _fresh_install(monkeypatch, {"vllm": "0.33.0"})
    assert install.main() == 0
    cmd = " ".join(ran[0])
    assert "--no-deps" in cmd and cmd.index("sglang/requirements-cpu.txt") < cmd.index("vllm/requirements-cpu.txt")
    assert "installed 1 packages: vllm 0.33.0" in capsys.readouterr().out
