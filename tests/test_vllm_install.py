"""vLLM's install path: its requirements on top of SGLang's set (no package pinned twice), and the
offline bundle for a CUDA machine without network: parts no larger than the limit, the extensions
and files the backends load, nothing else of the wheel, and an install that checks the parts."""
import json
import random
import zipfile

import pytest

from backends.sglang.install import REQUIREMENTS as SHARED
from backends.vllm import gpu_bundle
from backends.vllm.install import REQUIREMENTS


def _pins(path):
    return {line.split("==")[0].lower(): line.split("==")[1].strip() for line in path.read_text().splitlines()
            if "==" in line and not line.startswith("#")}


def test_vllms_requirements_add_to_sglangs_set_without_pinning_a_package_twice():
    vllm, shared = _pins(REQUIREMENTS), _pins(SHARED)
    assert vllm["vllm"] == "0.33.0" and not set(vllm) & set(shared)
    assert shared["openai"] == "2.25.0"  # vLLM's floor (its chain imports openai.types.responses.NamespaceTool)


WHEEL_FILES = {
    "vllm/__init__.py": b"x = 1\n", "vllm/config/model.json": b"{}",
    "vllm/_C_stable_libtorch.abi3.so": b"C" * 5000, "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"F" * 7000,
    "vllm/_flashmla_C.abi3.so": b"M" * 300, "vllm/_flashmla_extension_C.abi3.so": b"E" * 30,
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"2" * 9000, "vllm/_moe_C_stable_libtorch.abi3.so": b"o" * 100,
    "vllm/vllm-rs": b"R" * 4000, "vllm/third_party/deep_gemm/include/x.hpp": b"h" * 100,
    "vllm-0.33.0.dist-info/METADATA": b"Name: vllm\nVersion: 0.33.0\n",
}
KEPT = {"vllm/__init__.py", "vllm/config/model.json", "vllm/_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so",
        "vllm-0.33.0.dist-info/METADATA"}


def _fetch(pinned, into, python, cache):
    """pip download's stand-in: the vllm wheel above (incompressible enough to span parts) and one more."""
    assert python == "3.12" and any(p.startswith("vllm==") for p in pinned) and "openai==2.25.0" in pinned
    assert not any(p.startswith("flashinfer-python") for p in pinned)  # the machine's own
    into.mkdir(parents=True)
    with zipfile.ZipFile(into / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as z:
        for name, data in WHEEL_FILES.items():
            z.writestr(name, data + random.Random(name).randbytes(600))
    (into / "cbor2-6.3.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")


def test_the_bundle_keeps_what_the_backends_load_in_parts_below_the_limit(tmp_path):
    manifest = gpu_bundle.build(tmp_path / "out", None, part_bytes=1024, fetch=_fetch)
    parts = manifest["parts"]
    assert len(parts) > 1 and all(p["bytes"] <= 1024 for p in parts)
    assert [w["name"] for w in manifest["wheels"]] == ["cbor2-6.3.0-cp312-cp312-manylinux_2_28_x86_64.whl"]
    assert json.loads((tmp_path / "out" / "MANIFEST.json").read_text()) == manifest
    calls = []
    gpu_bundle.install(tmp_path / "out", tmp_path / "target", pip=lambda cmd, check: calls.append(cmd))
    got = {str(p.relative_to(tmp_path / "target")) for p in (tmp_path / "target").rglob("*") if p.is_file()}
    assert got == KEPT
    assert calls and "--no-index" in calls[0] and "--no-deps" in calls[0]


def test_install_names_a_part_that_did_not_copy_whole(tmp_path):
    gpu_bundle.build(tmp_path / "out", None, part_bytes=1024, fetch=_fetch)
    part = tmp_path / "out" / f"{gpu_bundle.ARCHIVE}.001"
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(SystemExit, match=f"{part.name}: .* copy it again"):
        gpu_bundle.install(tmp_path / "out", tmp_path / "target", pip=lambda cmd, check: None)
