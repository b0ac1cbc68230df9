"""Importing the kit's modules, and loading every registered backend class, changes nothing in the
process, in whatever order: no environment variable (TRITON_INTERPRET, VLLM_TARGET_DEVICE), no
import hook, no logger's level, and neither Triton (its interpreter is chosen before its first
import) nor an engine that sets the process up when imported (vLLM its platform, SGLang its caches)
imported. What an engine needs of the process is
set by the run that needs it (kit.harness.interpreter.choose, backends/vllm/environment.py), so a
test's result cannot depend on which test imported what first."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
MODULES = ("kit", "kit.__main__", "kit.listing", "kit.harness.runner", "kit.plugin.pytest_plugin", "kit.mutate",
           "matrix", "cases", "backends", "backends.triton", "backends.sglang", "backends.vllm", "backends.flashinfer",
           "backends.flashinfer_mla", "backends.torch_native", "backends.torch_sparse_mla",
           "backends.torch_native_linear", "backends.torch_native_hybrid")
# Imports the modules named on its command line in that order, then loads every registered backend
# class, and prints what changed in the process.
PROBE = """
import importlib, json, logging, os, sys
environ, hooks = dict(os.environ), [type(f).__name__ for f in sys.meta_path]
levels = {name: logging.getLogger(name).level for name in ("vllm", "sglang", "triton")}
for name in sys.argv[1:]:
    importlib.import_module(name)
from kit.harness.registry import known_backends, load_backend
for name in known_backends():
    load_backend(name)
print(json.dumps(dict(
    environ={k: os.environ.get(k) for k in set(environ) | set(os.environ) if environ.get(k) != os.environ.get(k)},
    hooks=[type(f).__name__ for f in sys.meta_path if type(f).__name__ not in hooks],
    imported=[name for name in ("triton", "vllm", "sglang") if name in sys.modules],
    levels={name: logging.getLogger(name).level for name in levels if logging.getLogger(name).level != levels[name]})))
"""
NOTHING = dict(environ={}, hooks=[], imported=[], levels={})
# The variables the kit's runs set: a process that starts without them, as a user's shell does.
RUN_SET = ("TRITON_INTERPRET", "VLLM_TARGET_DEVICE")


def _clean_environment() -> dict:
    """This process's environment without what the kit's runs and pytest's workers set."""
    return {k: v for k, v in os.environ.items() if k not in RUN_SET and not k.startswith("PYTEST_")}


def _changes(modules) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *modules], cwd=REPO, env=_clean_environment(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seed", [0, 1])
def test_importing_the_kit_in_any_order_changes_nothing_in_the_process(seed):
    order = random.Random(seed).sample(MODULES, len(MODULES))
    assert _changes(order) == NOTHING, order


def test_the_probe_sees_a_module_that_changes_the_process_when_imported():
    assert _changes(("kit", "tests.toys.import_side_effect"))["environ"] == {"KIT_TOY_IMPORTED": "1"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, Triton compiles: no interpreter is chosen")
def test_the_interpreter_is_chosen_by_a_kernels_definition_and_refused_after_triton():
    """Our Triton backend's kernels choose the interpreter where they are defined (a run's first
    launch); triton imported before, without it, is named with the fix."""
    chosen = ("import os, backends.triton\nassert 'TRITON_INTERPRET' not in os.environ\n"
              "import backends.triton.kernels\nprint(os.environ['TRITON_INTERPRET'])")
    late = "import triton\nfrom kit.harness import interpreter\ninterpreter.choose()"
    runs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_clean_environment(), capture_output=True,
                           text=True, timeout=600) for code in (chosen, late)]
    assert runs[0].returncode == 0 and runs[0].stdout.strip() == "1", runs[0].stderr[-3000:]
    assert runs[1].returncode != 0 and "TritonImportedFirst" in runs[1].stderr
    assert "set TRITON_INTERPRET=1" in runs[1].stderr.strip().splitlines()[-1]
