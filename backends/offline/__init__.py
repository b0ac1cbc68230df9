"""Offline bundles of an engine's attention backends (vLLM's, SGLang's, FlashInfer's) for a CUDA
computer without network that has torch, Triton and Python and nothing else of the engines' stacks.

- probe.py: run in a fresh process, loads each registered backend of an engine as its runs do
  (its engine modules included) and says what loaded and what failed;
- chain.py: that import chain, mapped to the distributions that own its files, less the target's
  base (torch and what it requires, Triton); a view of chosen distributions alone, to prove them
  sufficient;
- parts.py: the wheels as one tar in parts of at most PART_BYTES, joined and checked;
- bundle.py: build (trace, prove, download for the target's Python and platform, pack) and install
  (join, `pip install --target`, then the probe in a fresh process naming what is missing).

Each engine declares its bundle (a `Spec`): backends/vllm/gpu_bundle.py, backends/sglang/gpu_bundle.py,
backends/offline/flashinfer.py.
"""
