"""Results -> README table, KNOWN_FAILURES.md and the gate (built in the matrix issue)."""
