"""`python -m kit repro --standalone`: the file it writes runs with the kit not importable, prints
each layer's error against its limit and a verdict, and exits 1 when the engine is handed a wrong
batch."""
import os
import subprocess
import sys

import pytest

from backends.vllm.adapter import vllm_problem
from kit.__main__ import main
from kit.cli import USAGE

pytestmark = pytest.mark.skipif(vllm_problem() is not None, reason=str(vllm_problem()))
RUN = "vllm_triton_attn-decode-eager-gqa_fused_p16_fp32"


def _kit_blocked(tmp_path):
    """A PYTHONPATH under which `import kit` (and `import backends`) raises: the file must not need them."""
    for package in ("kit", "backends"):
        (tmp_path / "blocked" / package).mkdir(parents=True)
        (tmp_path / "blocked" / package / "__init__.py").write_text(
            f"raise ImportError('the standalone file imported {package}')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "blocked")
    probe = subprocess.run([sys.executable, "-c", "import kit"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "the standalone file imported kit" in probe.stderr
    return env


def _run_standalone(tmp_path, plant=None):
    path = tmp_path / "repro.py"
    assert main(["repro", "--standalone", RUN, "--out", str(path)]) == 0
    if plant:
        text = path.read_text()
        assert plant[0] in text
        path.write_text(text.replace(*plant))
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_kit_blocked(tmp_path), capture_output=True,
                          text=True, timeout=600)


def test_standalone_file_passes_without_the_kit(tmp_path):
    done = _run_standalone(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["layer 0", "layer 1"]
    assert all("<= limit" in line and line.endswith("PASS") for line in lines[:-1])
    assert lines[-1] == "PASS"


def test_standalone_file_fails_a_batch_one_key_short(tmp_path):
    # vLLM handed seq_lens one short attends one key fewer per request than the reference sees.
    done = _run_standalone(tmp_path, ("seq_lens=seq_lens.to(DEVICE)", "seq_lens=(seq_lens - 1).to(DEVICE)"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "> limit" in done.stdout and done.stdout.splitlines()[-1] == "FAIL"


@pytest.mark.parametrize("run_id, problem", [
    ("vllm_triton_attn-decode-graph-gqa_fused_p16_fp32", "eager runs only"),
    ("vllm_triton_attn-decode-eager-no_such_case", "no decode case named"),
    ("torch_native-decode-eager-gqa_fused_p16_fp32", "no standalone renderer"),
])
def test_what_no_file_reproduces_is_a_usage_error(tmp_path, capsys, run_id, problem):
    assert main(["repro", "--standalone", run_id, "--out", str(tmp_path / "r.py")]) == USAGE
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "r.py").exists()
