"""Offline bundles (backends/offline): the package list is vLLM's import chain less the target's
base, and that list with the base alone loads every vLLM backend that loads here; a chain module
outside both fails the proof, naming it; a module no distribution owns fails the build; parts stay
below the limit and an install joins them, installs the wheels with pip, then probes its backends
in a fresh process and fails naming a missing module and its wheel."""
import importlib.metadata
import json
import random
import zipfile
from pathlib import Path

import pytest

from backends.offline import bundle, chain, parts
from backends.sglang import gpu_bundle as sglang_bundle
from backends.vllm import gpu_bundle as vllm_bundle
from tests.toys import offline as toys

BASE = {"torch", "triton", "typing-extensions", "setuptools", "sympy", "jinja2", "filelock"}


@pytest.fixture(scope="module")
def vllms_chain():
    """vLLM's registered backends, and what decide() makes of their chain (one fresh process)."""
    backends = bundle.registered(vllm_bundle.SPEC)
    return backends, *bundle.decide(vllm_bundle.SPEC, "3.12", backends)


def test_vllms_bundle_is_its_chain_less_the_base(vllms_chain):
    """The issue's case: the list comes from the chain (pydantic, pyzmq, msgspec were missing when it
    came from requirement files) and holds neither the base nor FlashInfer nor the kit."""
    backends, pins, found, not_here = vllms_chain
    assert {"vllm", "pydantic", "pydantic-core", "pyzmq", "msgspec", "numpy", "transformers"} <= set(pins)
    assert not (BASE | {"flashinfer-python", chain.KIT}) & set(pins)
    assert {"zmq", "pydantic", "vllm"} <= set(found.top_levels(pins))
    assert len(not_here) < len(backends)


def test_vllms_bundle_with_the_base_alone_loads_each_backend_that_loads_here(vllms_chain):
    backends, pins, _, not_here = vllms_chain
    bundle.prove(vllm_bundle.SPEC, list(pins), "3.12", {n: t for n, t in backends.items() if n not in not_here})


@pytest.mark.parametrize("spec", [vllm_bundle.SPEC, sglang_bundle.SPEC], ids=["vllm", "sglang"])
def test_every_engine_adapter_says_what_its_runs_load(spec):
    """The bundle traces each registered adapter's own `load_engine`: an adapter without one (as the
    recurrent adapters were) leaves its imports out of the trace and fails the target's install check."""
    for name, target in bundle.registered(spec).items():
        module, _, attr = target.partition(":")
        assert callable(getattr(getattr(importlib.import_module(module), attr), "load_engine", None)), name


def test_a_chain_module_neither_in_the_bundle_nor_the_base_fails_the_proof():
    bundle.prove(toys.YAML, ["pyyaml"], "3.12", toys.BACKENDS)  # the list that holds it loads
    with pytest.raises(SystemExit, match="yaml-toy's bundle and the base alone do not load: toy: "
                                         "ModuleNotFoundError: No module named 'yaml'"):
        bundle.prove(toys.YAML, [], "3.12", toys.BACKENDS)


def _stub_probe(modules):
    return lambda spec, backends, **kw: chain.Probe(modules, {}, [])


def test_the_list_is_what_owns_the_chains_files_less_base_kit_and_others_bundles():
    import json as stdlib
    import torch
    import yaml

    import kit
    modules = {"yaml": yaml.__file__, "torch": torch.__file__, "json": stdlib.__file__, "kit": kit.__file__,
               "sys": None}
    pins, found, _ = bundle.decide(toys.YAML, "3.12", toys.BACKENDS, probe=_stub_probe(modules))
    assert list(pins) == ["pyyaml"] and found.top_levels(pins) == {"yaml": "pyyaml"}
    assert {"json", "sys"} <= found.stdlib and found.checkout == {"kit"}


def test_the_checkouts_modules_stay_the_checkouts_when_an_editable_installs_metadata_lists_them():
    """pip install -e leaves an egg-info in the checkout whose file list names the kit's files: they
    are still the checkout's; `__main__` (a spec of None in a pytest-xdist worker) is never looked up."""
    import kit
    from backends.offline import probe
    kit_file = Path(kit.__file__).resolve()
    found = chain.sort_modules({"kit": str(kit_file), "__main__": probe.__file__},
                               {kit_file: chain.KIT, Path(probe.__file__).resolve(): chain.KIT}, "3.12")
    assert found.checkout == {"kit", "__main__"} and not found.distributions


def test_a_module_no_distribution_owns_fails_the_build(tmp_path):
    planted = tmp_path / "stray.py"
    planted.write_text("")
    with pytest.raises(SystemExit, match=f"no installed distribution lists .*stray \\({planted}\\)"):
        bundle.decide(toys.YAML, "3.12", toys.BACKENDS, probe=_stub_probe({"stray": str(planted)}))


def test_a_module_the_targets_python_dropped_from_its_standard_library_is_not_base():
    import json as stdlib
    moved = {"distutils": str(Path(stdlib.__file__).with_name("distutils") / "__init__.py")}
    assert "distutils" in chain.sort_modules(moved, {}, "3.12").unowned
    assert "distutils" in chain.sort_modules(moved, {}, "3.11").stdlib


def _toy_wheel(folder: Path, name: str) -> Path:
    """A pure-Python wheel of distribution kit-toy-X, module kit_toy_X."""
    module, info = name.replace("-", "_"), f"{name.replace('-', '_')}-1.0.dist-info"
    files = {f"{module}/__init__.py": "VALUE = 1\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    path = folder / f"{module}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for arcname, text in files.items():
            z.writestr(arcname, text)
    return path


def _toy_bundle(tmp_path: Path, packed) -> Path:
    """A bundle of the toy wheels `packed`, its manifest listing both toys' modules, as build writes it."""
    out, wheels = tmp_path / "bundle", tmp_path / "wheels"
    out.mkdir()
    wheels.mkdir()
    files = {name: _toy_wheel(wheels, name) for name in ("kit-toy-a", "kit-toy-b")}
    manifest = {"bundle": "toys", "install": "python -m tests.toys.offline install", "python": "3.12",
                **parts.pack([files[n] for n in packed], out, toys.WHEELS.archive, 1 << 20),
                "modules": {"kit_toy_a": files["kit-toy-a"].name, "kit_toy_b": files["kit-toy-b"].name}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest))
    return out


def test_install_puts_the_wheels_in_the_target_and_checks_the_backends_load_there(tmp_path, capsys):
    out = _toy_bundle(tmp_path, ["kit-toy-a", "kit-toy-b"])
    names = bundle.install(toys.WHEELS, out, tmp_path / "target", backends=toys.BACKENDS)
    assert names == ["kit_toy_a-1.0-py3-none-any.whl", "kit_toy_b-1.0-py3-none-any.whl"]
    assert (tmp_path / "target" / "kit_toy_b" / "__init__.py").exists()
    said = capsys.readouterr().out
    assert "installed into" in said and "kit_toy_a 1.0, kit_toy_b 1.0" in said and "1 backends load from" in said


def test_install_fails_naming_the_missing_module_and_its_wheel(tmp_path):
    out = _toy_bundle(tmp_path, ["kit-toy-a"])  # kit-toy-b's wheel left out of the parts
    with pytest.raises(SystemExit) as caught:
        bundle.install(toys.WHEELS, out, tmp_path / "target", backends=toys.BACKENDS)
    said = str(caught.value)
    assert "toy: ModuleNotFoundError: No module named 'kit_toy_b'" in said, said
    assert "missing modules: kit_toy_b (wheel kit_toy_b-1.0-py3-none-any.whl)" in said, said
    assert "kit_toy_a (" not in said


def test_install_names_a_program_the_engine_runs_that_is_not_on_path(tmp_path, monkeypatch):
    import dataclasses
    out = _toy_bundle(tmp_path, ["kit-toy-a", "kit-toy-b"])
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    spec = dataclasses.replace(toys.WHEELS, tools=("kit-toy-compiler",))
    with pytest.raises(SystemExit, match="not on PATH: kit-toy-compiler: export PATH=.*target/bin"):
        bundle.check(spec, tmp_path / "target", json.loads((out / "MANIFEST.json").read_text()),
                     probe=_stub_probe({}), backends=toys.BACKENDS)


def test_install_refuses_another_engines_bundle(tmp_path):
    out = _toy_bundle(tmp_path, ["kit-toy-a"])
    with pytest.raises(SystemExit, match="is toys's bundle: install it with python -m tests.toys.offline install"):
        bundle.install(toys.YAML, out, tmp_path / "target", backends=toys.BACKENDS)


def test_parts_stay_below_the_limit_and_a_part_cut_short_is_named(tmp_path):
    files = []
    for i in range(3):
        path = tmp_path / f"w{i}.whl"
        path.write_bytes(random.Random(i).randbytes(3000))  # incompressible: spans parts
        files.append(path)
    out = tmp_path / "out"
    out.mkdir()
    manifest = parts.pack(files, out, "x.tar", 1024)
    assert len(manifest["parts"]) > 1 and all(p["bytes"] <= 1024 for p in manifest["parts"])
    back = parts.unpack(out, manifest, _mkdir(tmp_path / "back"))
    assert [p.read_bytes() for p in back] == [p.read_bytes() for p in files]
    cut = out / manifest["parts"][1]["name"]
    cut.write_bytes(cut.read_bytes()[:-1])
    with pytest.raises(SystemExit, match=f"{cut.name}: .* copy it again"):
        parts.unpack(out, manifest, _mkdir(tmp_path / "again"))


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def test_a_module_another_bundle_brings_is_named_with_that_bundle(tmp_path):
    manifest = {"modules": {"kit_toy_a": "kit_toy_a-1.0-py3-none-any.whl"}, "elsewhere": {"flashinfer": "flashinfer-python"}}
    missing = lambda spec, backends, **kw: chain.Probe({}, {"toy": "ModuleNotFoundError: No module named 'flashinfer'"},
                                                        ["flashinfer"])
    with pytest.raises(SystemExit, match="missing modules: flashinfer \\(flashinfer-python's own bundle: install it "
                                         "first, its folder on PYTHONPATH\\)"):
        bundle.check(toys.WHEELS, tmp_path, manifest, probe=missing, backends=toys.BACKENDS)


def test_an_alias_in_sys_modules_is_no_module_of_the_chain():
    """A package may put a module in sys.modules under another name (vLLM's `model_executor`,
    xgrammar's `xgr`): no import finds it by that name, so a bundle that expected it on the target
    would fail its install check while every backend loads."""
    owned = {Path(json.__file__).resolve(): "toy-dist"}
    found = chain.sort_modules({"json": json.__file__, "json_alias_of_no_import": json.__file__}, owned, "3.12")
    assert found.distributions == {"toy-dist": {"json"}}


def test_install_puts_what_a_wheels_pth_file_adds_on_the_printed_path_and_checks_it_imports(tmp_path, capsys):
    """pip's --target leaves a wheel's .pth file unread (nvidia-cutlass-dsl's puts `cutlass` on the
    path so): the check imports a module that only that path holds, and the printed PYTHONPATH has it."""
    import dataclasses
    out = _toy_bundle(tmp_path, ["kit-toy-a", "kit-toy-b"])
    target = tmp_path / "target"
    (target / "kit_toy_dsl" / "kit_toy_hidden").mkdir(parents=True)
    (target / "kit_toy_dsl" / "kit_toy_hidden" / "__init__.py").write_text("")
    (target / "kit_toy_dsl.pth").write_text("kit_toy_dsl\n")
    spec = dataclasses.replace(toys.WHEELS, runs_import=("kit_toy_hidden",))
    bundle.install(spec, out, target, backends=toys.BACKENDS)
    assert f"export PYTHONPATH={target}:{target / 'kit_toy_dsl'}$" in capsys.readouterr().out
    (target / "kit_toy_dsl.pth").unlink()
    with pytest.raises(SystemExit, match="missing modules: kit_toy_hidden \\(no wheel of the bundle brings it"):
        bundle.check(spec, target, json.loads((out / "MANIFEST.json").read_text()), backends=toys.BACKENDS)


def test_flashinfers_bundle_brings_the_cutlass_dsl_the_pinned_engines_require():
    """Both engines pin nvidia-cutlass-dsl[cu13]; FlashInfer's bundle brings that pin and the extra's wheels."""
    from backends.offline.flashinfer import SPEC
    pins = dict(pin.split("==") for pin in SPEC.also)
    for engine in ("vllm", "sglang"):
        required = [r for r in importlib.metadata.requires(engine) or () if r.startswith("nvidia-cutlass-dsl")]
        assert required, f"{engine} no longer requires nvidia-cutlass-dsl: drop it from the FlashInfer bundle"
        extra, version = required[0].partition("[")[2].partition("]")[0], required[0].rpartition("==")[2]
        assert pins["nvidia-cutlass-dsl"] == version and pins[f"nvidia-cutlass-dsl-libs-{extra}"] == version, required
    assert "cutlass" in SPEC.runs_import


def test_sglangs_bundle_brings_the_flash_mla_sglang_requires():
    """SGLang's DSA backend runs FlashMLA's sparse kernel, imported only on a GPU: the bundle brings the
    sgl-flash-mla pin sglang requires and its install checks that flash_mla imports there."""
    from backends.sglang.gpu_bundle import SPEC
    required = [r for r in importlib.metadata.requires("sglang") or () if r.startswith("sgl-flash-mla")]
    assert required, "sglang no longer requires sgl-flash-mla: drop it from its bundle"
    assert required[0].partition(";")[0].strip() in SPEC.also and "flash_mla" in SPEC.runs_import
