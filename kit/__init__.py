"""Conformance kit for LLM attention backends.

Data flows one way: case -> plan -> fixture (pools + batch) -> backend ->
verdict -> result record -> matrix table.
"""
