"""vLLM's install path: its requirements on top of SGLang's set (no package pinned twice), and the
vllm wheel of the offline bundle for a CUDA machine without network: the extensions and files the
backends load, nothing else of the wheel (tests/test_offline_bundles.py: the rest of the bundle)."""
import zipfile

from backends.offline import bundle
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
        "vllm-0.33.0.dist-info/METADATA", "vllm-0.33.0.dist-info/RECORD"}


def test_the_bundles_vllm_wheel_keeps_what_the_backends_load_and_its_record_lists_that_alone(tmp_path):
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in WHEEL_FILES.items())
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in {**WHEEL_FILES, "vllm-0.33.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(name, data)
    (tmp_path / "out").mkdir()
    trimmed = bundle.trim(wheel, gpu_bundle.kept, tmp_path / "out")
    with zipfile.ZipFile(trimmed) as z:
        assert set(z.namelist()) == KEPT
        assert {line.split(",")[0] for line in z.read("vllm-0.33.0.dist-info/RECORD").decode().splitlines()} == \
            KEPT - {"vllm-0.33.0.dist-info/RECORD"}
