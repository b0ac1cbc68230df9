"""In-box backends: a new backend is one file here plus one entry point in pyproject.toml
(group attention_conformance.backends, the group external backends register in too)."""

# vLLM fixes its platform at its first import, and SGLang's import chain imports it too: its
# environment is set before any in-box backend loads (backends/vllm/environment.py).
import backends.vllm  # noqa: E402,F401
