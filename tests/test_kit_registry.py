"""Backend lookup: in-box names, module:attr and entry points for code the kit did not write."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cases import CATALOG as catalog
from backends.torch_native import TorchNativeBackend
from kit.modes import Exec, ForwardMode
from kit.engine.profile import SGLANG
from kit.harness.registry import UnknownBackend, load_backend
from kit.report.record import FAIL, PASS, UNSUPPORTED
from kit.harness.runner import run_case

REPO = Path(__file__).resolve().parent.parent

EXTERNAL = textwrap.dedent('''
    """A backend written outside the kit's repository: decode only, plain torch."""
    import torch
    from kit.engine.profile import SGLANG

    class ExternalDecode:
        name = "external_decode"
        profile = SGLANG

        @classmethod
        def supports(cls, case):
            return None if case.mode.value == "decode" else "decode only"

        def __init__(self, ctx):
            self.ctx = ctx

        def init_forward_metadata(self, batch):
            self.lens = batch.seq_lens_cpu.tolist()
            self.rows = batch.req_pool_indices.tolist()

        def forward(self, q, k, v, layer, batch, save_kv_cache=True):
            pool = batch.token_to_kv_pool
            pool.set_kv_buffer(layer, batch.out_cache_loc, k, v)
            kc, vc = pool.get_kv_buffer(layer.layer_id)
            g = layer.tp_q_head_num // layer.tp_k_head_num
            out = torch.empty_like(q)
            for i, (row, n) in enumerate(zip(self.rows, self.lens)):
                w = layer.sliding_window_size
                lo = max(0, n - 1 - w) if w >= 0 else 0
                slots = batch.req_to_token_pool.req_to_token[row, lo:n].long()
                kk = kc[slots].float().repeat_interleave(g, 1)
                vv = vc[slots].float().repeat_interleave(g, 1)
                s = torch.einsum("hd,khd->hk", q[i].float(), kk) * layer.scaling
                if layer.logit_cap > 0:
                    s = layer.logit_cap * torch.tanh(s / layer.logit_cap)
                out[i] = torch.einsum("hk,khd->hd", s.softmax(-1), vv).to(q.dtype)
            return out


    class ExternalByModule(ExternalDecode):
        name = "external_by_module"
''')


@pytest.fixture
def external_dir(tmp_path):
    """A module outside the repo, also registered as an entry point through a dist-info folder."""
    (tmp_path / "ext_attn.py").write_text(EXTERNAL)
    dist = tmp_path / "ext_attn-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ext-attn\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[attention_conformance.backends]\nexternal_decode = ext_attn:ExternalDecode\n")
    return tmp_path


def _env(extra_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(extra_path), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_unknown_backend_lists_known_ones():
    """An unknown name fails with the list of known backends."""
    with pytest.raises(UnknownBackend, match="torch_native"):
        load_backend("no_such_backend")


def test_unknown_backend_is_a_usage_error_in_the_suite():
    """pytest --backend with an unknown name stops at collection, naming the known ones."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q",
                           "--backend", "no_such_backend", "-p", "no:cacheprovider"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "torch_native" in proc.stderr


class _BrokenConstructor:
    profile = SGLANG

    @classmethod
    def supports(cls, case):
        return None

    def __init__(self, ctx):
        raise RuntimeError("cannot allocate workspace")


def test_construction_error_is_a_crash_not_a_skip():
    """A backend that fails to construct is a failure of class crash."""
    case = catalog.cases("smoke", ForwardMode.DECODE)[0]
    result = run_case("tests.test_kit_registry:_BrokenConstructor", case, Exec.EAGER)
    assert (result.outcome, result.failure_class) == (FAIL, "crash")
    assert "constructing backend" in result.message and "cannot allocate workspace" in result.message


def test_external_backend_runs_through_the_suite(external_dir, tmp_path):
    """module:attr and entry-point backends defined outside the repo run the smoke set, records written."""
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:cacheprovider",
         "-n", "2", "--backend", "ext_attn:ExternalByModule", "--backend", "external_decode",
         "--exec", "eager", "--case-set", "smoke", "--results-json", str(out)],
        cwd=REPO, capture_output=True, text=True, env=_env(external_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    n_cases = sum(len(catalog.matrix_cases("smoke", m)) for m in ForwardMode)
    assert len(records) == 2 * n_cases  # both specs, every mode, eager
    dense_decode = {c.name for c in catalog.cases("smoke", ForwardMode.DECODE)
                    if not c.kv_lora_rank and not c.sinks and c.kv_dtype is None}
    ran = [r for r in records if r["mode"] == "decode" and r["case"] in dense_decode]
    assert {r["backend"] for r in ran} == {"external_by_module", "external_decode"}
    assert all(r["outcome"] == PASS for r in ran)
    assert {r["outcome"] for r in records if r not in ran} == {"unsupported"}  # other modes, MLA, sinks, fp8 KV
    for r in records:
        for field in ("backend", "mode", "exec", "case", "dtype", "outcome", "failure_class", "max_err",
                      "seconds", "device", "versions", "kit_commit", "repro"):
            assert field in r, field
        assert set(r["versions"]) == {"torch", "cuda"}, "an external backend without versions(): the kit's own"


def test_external_backend_through_the_repro_command(external_dir):
    """The repro command accepts module:attr too."""
    case = catalog.cases("smoke", ForwardMode.DECODE)[0]
    proc = subprocess.run([sys.executable, "-m", "kit", "run", "--backend", "ext_attn:ExternalDecode",
                           "--mode", "decode", "--exec", "eager", "--case", case.name],
                          cwd=REPO, capture_output=True, text=True, env=_env(external_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ": pass" in proc.stdout


def test_in_box_and_external_backends_share_one_lookup(external_dir):
    """`triton` and an external entry point resolve through the same entry-point group."""
    code = textwrap.dedent('''
        import importlib.metadata as md
        from kit.harness import registry
        group = {ep.name: ep for ep in md.entry_points(group=registry.ENTRY_POINT_GROUP)}
        assert {"torch_native", "triton", "flashinfer", "external_decode"} <= set(group), sorted(group)
        loaded = []
        real_load = md.EntryPoint.load
        md.EntryPoint.load = lambda ep: loaded.append(ep.name) or real_load(ep)
        for name in ("triton", "external_decode"):
            assert registry.load_backend(name) is real_load(group[name])
        assert loaded == ["triton", "external_decode"], loaded
        assert {"triton", "external_decode"} <= set(registry.known_backends())
    ''')
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=_env(external_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr


class _DecodeOnly(TorchNativeBackend):
    modes = (ForwardMode.DECODE,)


class _FutureMode(TorchNativeBackend):
    """Implements a mode the protocol may add later; says so by value."""
    modes = ("decode", "extend", "some_future_mode")


def test_mode_a_backend_leaves_out_is_unsupported_not_a_crash():
    case = catalog.cases("smoke", ForwardMode.EXTEND)[0]
    r = run_case("tests.test_kit_registry:_DecodeOnly", case, Exec.EAGER)
    assert r.outcome == UNSUPPORTED and "does not implement mode extend" in r.message
    assert run_case("tests.test_kit_registry:_FutureMode", case, Exec.EAGER).outcome == PASS


def test_library_versions_come_from_the_backend():
    """Records carry torch/CUDA plus what the backend's versions() names, nothing hard-coded."""
    case = catalog.cases("smoke", ForwardMode.DECODE)[0]
    assert set(run_case("torch_native", case, Exec.EAGER).versions) == {"torch", "cuda"}
    assert set(run_case("triton", case, Exec.EAGER).versions) == {"torch", "cuda", "triton"}


def test_a_library_version_is_its_distributions_not_an_import(tmp_path, monkeypatch):
    """A version comes from the installed distribution's metadata: one whose module has another
    name (sgl-flash-mla installs flash_mla) is found, and nothing is imported to ask."""
    from kit.harness.protocol import library_version
    info = tmp_path / "kit_probe_dist-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kit-probe-dist\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert library_version("kit-probe-dist") == "1.2.3"
    assert library_version("kit-no-such-dist") == "not installed"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="`auto` is the smoke set on CPU only")
def test_ci_cases_narrow_a_plain_cpu_run_and_smoke_runs_them_all(tmp_path):
    """A backend's `ci_cases` are what `--case-set auto` on CPU gives it; `--case-set smoke` gives every
    smoke case; either way the results file's catalog lists every run."""
    def collected(*args):
        proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "--co", "-q",
                               "-p", "no:cacheprovider", "--backend", "tests.toys.dense:CiSubsetBackend",
                               "--mode", "decode", *args], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return sorted(line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if "[" in line)

    assert collected() == ["toy_ci_subset-decode-eager-mqa_p1_shuf", "toy_ci_subset-decode-graph-mqa_p1_shuf"]
    assert len(collected("--case-set", "smoke")) == 2 * len(catalog.matrix_cases("smoke", ForwardMode.DECODE))


def test_in_box_ci_cases_name_smoke_cases():
    """A misspelt `ci_cases` name would drop a case from CI without a word."""
    from kit.harness import registry
    for name in registry.known_backends():
        for mode, names in (getattr(load_backend(name), "ci_cases", None) or {}).items():
            smoke = {c.name for c in catalog.matrix_cases("smoke", ForwardMode(mode))}
            assert set(names) <= smoke, (name, mode, set(names) - smoke)


def test_in_box_is_the_kits_own_kernels_as_pyproject_registers_them():
    """IN_BOX, the one definition of "in-box" (the benchmarks' matrix, the tracked fuzz ledger), is
    every backend the kit's package registers that is not an engine's adapter."""
    import tomllib

    from kit.harness.registry import IN_BOX, is_in_box
    registered = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][
        "attention_conformance.backends"]
    adapters = ("backends.sglang:", "backends.vllm:")
    assert set(IN_BOX) == {name for name, target in registered.items() if not target.startswith(adapters)}
    assert [spec for spec in registered if is_in_box(spec)] == [spec for spec in registered if spec in IN_BOX]
