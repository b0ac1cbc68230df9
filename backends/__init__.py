"""In-box backends: a new backend is one file here plus one entry point in pyproject.toml
(group attention_conformance.backends, the group external backends register in too)."""
