"""Fuzzing with shrinking (`python -m kit fuzz`): Hypothesis draws valid cases over every
feature the kit has (strategies), runs each through the suite's runner and verdicts and
shrinks a failure to a minimal case (search), prints it as one `Case(...)` line with its
repro command, and appends every fuzz run to a ledger (ledger)."""
