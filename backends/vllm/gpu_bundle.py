"""python -m backends.vllm.gpu_bundle — vLLM's attention backends for an offline x86_64 CUDA
computer, in parts of at most 30 MiB (backends/offline/bundle.py says how it is decided and checked):

    python -m backends.vllm.gpu_bundle build OUT [--wheels DIR] [--python 3.12]   (where there is network)
    python -m backends.vllm.gpu_bundle install BUNDLE TARGET                       (on the CUDA machine)

The bundle is what vLLM's attention import chain loads (every vLLM backend the kit registers, as
its runs load it), less torch, Triton and FlashInfer (backends/offline/flashinfer.py brings it). Of
the vllm wheel it keeps what the attention backends load: its Python files and data, its
dist-info, and the compiled extensions COMPILED (FlashAttention 3, FlashMLA, and
`_C_stable_libtorch`, which vllm/platforms/cuda.py:23 imports unconditionally: without it no vLLM
backend loads on CUDA), all built against torch's stable C ABI. It leaves out the other extensions
(FA2, MoE, DeepGEMM, ...), the `vllm-rs` frontend binary and C++ headers.
"""
from __future__ import annotations

import sys

from backends.offline.bundle import Spec, engine_load, main

COMPILED = ("vllm/vllm_flash_attn/_vllm_fa3_C", "vllm/_flashmla_C", "vllm/_flashmla_extension_C",
            "vllm/_C_stable_libtorch")
LEFT_OUT_SUFFIXES = (".h", ".hpp", ".cuh", ".inl", ".cu", ".cpp")
LEFT_OUT_FILES = ("vllm/vllm-rs",)


def kept(name: str) -> bool:
    """Whether a file of the vllm wheel goes into the bundle."""
    if name.endswith(".so"):
        return name.split(".", 1)[0] in COMPILED
    return not name.endswith(LEFT_OUT_SUFFIXES) and name not in LEFT_OUT_FILES


SPEC = Spec(name="vllm", engine="vllm", where="backends.vllm.gpu_bundle:SPEC", packages=("backends.vllm",),
            load=engine_load, leaves_out=("flashinfer-python",), keeps=kept)

if __name__ == "__main__":
    sys.exit(main(SPEC))
