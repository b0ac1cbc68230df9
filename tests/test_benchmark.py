"""benchmarks.kit_throughput: one timed matrix run on a tiny selection appends a complete row."""
import json
import subprocess
import sys

from benchmarks.kit_throughput import device
from kit.results import REPO

SMOKE_DECODE_RUNS = 8  # torch_native's smoke decode cases, eager (graph: unsupported, not counted)


def test_throughput_row(tmp_path):
    out, kept = tmp_path / "bench.json", tmp_path / "results.json"
    out.write_text(json.dumps([{"earlier": "row"}]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kit_throughput", "--workers", "2", "--out", str(out),
                           "--results-json", str(kept), "--case-set", "smoke", "--backend", "torch_native",
                           "--mode", "decode"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    earlier, row = json.loads(out.read_text())
    assert earlier == {"earlier": "row"}  # appended, not replaced
    assert row["device"] == device()[0] and row["workers"] == "2" and row["cold"] is False
    assert row["runs"] == SMOKE_DECODE_RUNS and row["seconds"] > 0
    assert row["runs_per_s"] == round(row["runs"] / row["seconds"], 2)
    assert row["kit_commit"] and row["args"] == ["--backend", "torch_native", "--mode", "decode"]
    assert len(row["slowest"]) == SMOKE_DECODE_RUNS
    assert all(s["run"].startswith("torch_native-decode-eager-") for s in row["slowest"])
    assert [s["seconds"] for s in row["slowest"]] == sorted((s["seconds"] for s in row["slowest"]), reverse=True)
    # --results-json keeps the timed run's results: the matrix and its timing from one run
    assert len(json.loads(kept.read_text())["records"]) == 2 * SMOKE_DECODE_RUNS
