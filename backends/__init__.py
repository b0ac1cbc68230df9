"""In-box backends: a new backend is one file here plus one entry point in pyproject.toml
(group attention_conformance.backends, the group external backends register in too).
Loading a backend's class changes nothing in the process: what an engine needs of it is set
where the engine is first imported (backends/vllm/environment.py)."""
