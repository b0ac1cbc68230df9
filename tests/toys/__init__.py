"""Toy backends used as fixtures by the kit's own tests (never shipped as backends)."""
