"""`python -m kit repro --standalone RUN_ID`: one Python file that reproduces a run with only the
engine and torch imported (scenario.py: the run's batch as plain data; one renderer per engine
writes the file around it)."""
