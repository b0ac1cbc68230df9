"""A new mode is its rules file and its catalog file, nothing else: a copy of the kit given a toy
mode's two files (kit/engine/modes/toy.py, cases/toy.py) runs it end to end, a conformance run
of torch_native (which reads each mode's requests through the mode's rules) recorded as any mode's."""
import json
import subprocess
import sys

from tests.helpers import copy_of_the_kit

RULES = '''"""TOY: two new tokens per request, causal; seq_lens = prefix + 2 (a test's mode)."""
from kit.engine.modes.rules import ModeRules, RequestShape, causal, extend_fields
from kit.modes import ForwardMode


class Toy(ModeRules):
    mode = ForwardMode.TOY
    new_help = "always 2"

    def validate(self, case):
        return None if case.new == 2 and case.topk == 1 else "TOY has two new tokens per request (new=2)"

    def request(self, case, prefix, new, rng):
        return RequestShape(n_old=prefix, n_new=2, seq_len=prefix + 2, q_pos=[prefix, prefix + 1],
                            visible=causal(prefix, 2))

    def batch_fields(self, plan, device):
        return extend_fields(plan, device)


RULES = Toy()
'''
CATALOG = '''"""TOY cases."""
from kit.engine.case import GQA, Case
from kit.modes import ForwardMode

SMOKE = [Case("toy_gqa_p4", mode=ForwardMode.TOY, prefix=(3, 0, 9), new=2, page=4, heads=GQA, head_dim=16,
              dtype="fp32")]
FULL = SMOKE
'''
COPIED = ("kit", "cases", "backends", "matrix", "tests/__init__.py", "tests/test_conformance.py", "KNOWN_FAILURES.md",
          "pyproject.toml")


def test_a_mode_is_its_rules_file_and_its_catalog_file(tmp_path):
    copy_of_the_kit(tmp_path, COPIED)
    (tmp_path / "kit/engine/modes/toy.py").write_text(RULES)
    (tmp_path / "cases/toy.py").write_text(CATALOG)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--backend", "torch_native", "--mode", "toy", "--results-json", "r.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = {(r["exec"], r["case"]): (r["outcome"], r["message"])
               for r in json.loads((tmp_path / "r.json").read_text())["records"]}
    assert records[("eager", "toy_gqa_p4")] == ("pass", ""), records
    assert records[("graph", "toy_gqa_p4")] == ("unsupported", "no capture hooks"), records
