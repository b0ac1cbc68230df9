"""python -m backends.sglang.gpu_bundle — SGLang's attention backends for an offline x86_64 CUDA
computer, in parts of at most 30 MiB (backends/offline/bundle.py says how it is decided and checked):

    python -m backends.sglang.gpu_bundle build OUT [--wheels DIR] [--python 3.12]   (where there is network)
    python -m backends.sglang.gpu_bundle install BUNDLE TARGET                       (on the CUDA machine)

The bundle is what SGLang's attention import chain loads (every SGLang backend the kit registers,
as its runs load it: the adapter's runtime and the SGLang class it wraps), less torch, Triton,
FlashInfer (backends/offline/flashinfer.py brings it) and vllm, which SGLang's chain imports and
vLLM's bundle brings trimmed to what loads (the whole wheel is ten times the rest). sgl_kernel and torchvision are not in it:
where they are absent the adapter's import stand-ins serve SGLang's imports of them
(backends/sglang/shims.py).
"""
from __future__ import annotations

import sys

from backends.offline.bundle import Spec, engine_load, main

# SGLang's DSA backend imports FlashMLA's sparse kernel (flash_mla) when it first runs on a GPU, which no
# import chain on a machine without one reaches: the sgl-flash-mla wheel at the pin sglang 0.5.23 requires.
FLASH_MLA = "sgl-flash-mla==1.0.0"

SPEC = Spec(name="sglang", engine="sglang", where="backends.sglang.gpu_bundle:SPEC", packages=("backends.sglang",),
            load=engine_load, leaves_out=("flashinfer-python", "vllm"), also=(FLASH_MLA,), runs_import=("flash_mla",))

if __name__ == "__main__":
    sys.exit(main(SPEC))
