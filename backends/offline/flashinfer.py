"""python -m backends.offline.flashinfer — FlashInfer for the kit's in-box FlashInfer backends (and
the engines' FlashInfer backends: the vLLM and SGLang bundles leave it to this one) on an offline
x86_64 CUDA computer, in parts of at most 30 MiB (backends/offline/bundle.py says how it is decided
and checked):

    python -m backends.offline.flashinfer build OUT [--wheels DIR] [--python 3.12]   (where there is network)
    python -m backends.offline.flashinfer install BUNDLE TARGET                       (on the CUDA machine)

The bundle is what importing FlashInfer as the in-box backends do loads, less torch and Triton,
plus ninja: FlashInfer compiles each kernel variant on first use, running `ninja` from PATH (the
install says to put TARGET/bin first) and the machine's nvcc. Of the flashinfer-python wheel it
keeps the Python modules, the headers and the kernel sources at the top of data/csrc (the attention
kernels the JIT builds: batch decode, prefill, MLA), not the per-model sub-projects in its folders.
Compiled kernels go to ~/.cache/flashinfer; a filled cache copied along skips the first compile.
"""
from __future__ import annotations

import sys

from backends.offline.bundle import Spec, main

CSRC = "flashinfer/data/csrc/"


def kept(name: str) -> bool:
    """Whether a file of the flashinfer-python wheel goes into the bundle: not one in a folder of csrc."""
    return not (name.startswith(CSRC) and "/" in name[len(CSRC):])


def load(cls) -> None:
    """What the in-box FlashInfer backends import of FlashInfer (backends/flashinfer.py, at its import)."""
    from backends import flashinfer

    if flashinfer.IMPORT_ERROR is not None:
        raise flashinfer.IMPORT_ERROR


# FlashInfer's CuTe DSL kernels (the GDN prefill vLLM and SGLang run on Hopper: flashinfer/gdn_prefill.py)
# import `cutlass` when they first run, which no import chain on a machine without a GPU reaches:
# nvidia-cutlass-dsl at the pin vLLM 0.33 and SGLang 0.5.23 both require ([cu13]), and its library wheels.
CUTLASS_DSL = tuple(f"{name}==4.8.0" for name in ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base",
                                                  "nvidia-cutlass-dsl-libs-core", "nvidia-cutlass-dsl-libs-cu13"))

SPEC = Spec(name="flashinfer", engine="flashinfer-python", where="backends.offline.flashinfer:SPEC",
            packages=("backends.flashinfer", "backends.flashinfer_mla"), load=load, keeps=kept, tools=("ninja",),
            also=("ninja==1.13.2", *CUTLASS_DSL), runs_import=("cutlass",))

if __name__ == "__main__":
    sys.exit(main(SPEC))
